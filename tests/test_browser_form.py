"""The launch form in real Chromium at 1400x1000: height, conditional fields, presets, sticky Launch,
keyboard order, YAML in and out. Screenshots of the form at its defaults go to test-artifacts/.

Starts `tunedeck serve` on a free port with a temporary TUNEDECK_HOME (tests/browser_helpers.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, REPO, chromium, served
from engines import engine_missing, import_or_missing

pytestmark = pytest.mark.browser
if not Path(CHROMIUM).exists():
    engine_missing(f"{CHROMIUM} is missing: apt-get install -y chromium", module_level=True)
import_or_missing("playwright.sync_api")

from jobs.spec.field_info import field_infos  # noqa: E402 - after the skips, like the other browser tests

ARTIFACTS = REPO / "test-artifacts"
VIEWPORT = {"width": 1400, "height": 1000}
TITLES = {f.name: f.title for f in field_infos()}
QLORA_FIELDS = ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with served(tmp_path_factory.mktemp("tunedeck-home")) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(server, browser):
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(server)
    # The form's first fill on a cold server (memory prediction, data preview) takes tens of seconds when loaded.
    page.get_by_text("Detected format").wait_for(timeout=120_000)
    page.locator("#budget").get_by_text("Effective batch size").wait_for(timeout=120_000)
    yield page
    page.close()


def field(page, name: str):
    """The input of a spec field, found by its label as a user reads it (a slider by its number box)."""
    title = TITLES[name]
    return page.get_by_label(title, exact=True).or_(page.get_by_label(f"number input for {title}", exact=True))


def option_text(name: str, value: str) -> str:
    """What a dropdown shows for a value: the method choice carries each method's description."""
    from jobs.spec.enums import METHOD_DESCRIPTIONS, Method

    return f"{value}: {METHOD_DESCRIPTIONS[Method(value)]}" if name == "method" else value


def choose(page, name: str, value: str) -> None:
    box = field(page, name)
    box.click()
    page.get_by_role("option", name=option_text(name, value), exact=True).click()


def shown(page, name: str) -> bool:
    return field(page, name).is_visible()


def wait_shown(page, name: str, visible: bool) -> None:
    field(page, name).wait_for(state="visible" if visible else "hidden", timeout=15_000)


def page_height(page) -> int:
    return page.evaluate("document.documentElement.scrollHeight")


def test_form_at_its_defaults_fits_two_screens_and_hides_qlora_fields_for_lora(page):
    ARTIFACTS.mkdir(exist_ok=True)
    assert field(page, "model").input_value() == "smollm2-135m-instruct"
    assert field(page, "method").input_value() == option_text("method", "lora")
    height = page_height(page)
    page.screenshot(path=str(ARTIFACTS / "launch-form-defaults-smollm2.png"), full_page=True)
    assert height <= 2 * VIEWPORT["height"], f"the launch page is {height} px tall at 1400x1000"
    assert all(not shown(page, n) for n in QLORA_FIELDS), "QLoRA fields shown for method lora"
    assert not shown(page, "beta") and not shown(page, "num_virtual_tokens")
    assert shown(page, "lora_r") and not shown(page, "seed")  # seed sits in the closed "More: training"

    choose(page, "method", "qlora")
    for name in QLORA_FIELDS:
        wait_shown(page, name, True)
    field(page, "bnb_4bit_quant_type").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "launch-form-qlora.png"))
    choose(page, "method", "lora")
    for name in QLORA_FIELDS:
        wait_shown(page, name, False)
    choose(page, "method", "prompt_tuning")
    wait_shown(page, "num_virtual_tokens", True)
    wait_shown(page, "lora_r", False)
    choose(page, "trainer", "dpo")
    wait_shown(page, "beta", True)


def test_form_with_the_tiny_model_fits_two_screens(page):
    ARTIFACTS.mkdir(exist_ok=True)
    box = field(page, "model")
    box.fill("tiny-llama")
    box.press("Enter")
    page.locator("#budget").get_by_text("tiny-llama").wait_for(timeout=30_000)
    height = page_height(page)
    page.screenshot(path=str(ARTIFACTS / "launch-form-defaults-tiny.png"), full_page=True)
    assert height <= 2 * VIEWPORT["height"], f"the launch page is {height} px tall with tiny-llama"


def test_verdict_and_launch_stay_in_view_while_scrolling(page):
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    page.wait_for_function("window.scrollY > 0")
    assert page.evaluate("window.scrollY") > 300
    for sel in ("#launch-btn", "#budget"):
        box = page.locator(sel).bounding_box()
        assert box and 0 <= box["y"] and box["y"] + box["height"] <= VIEWPORT["height"], (sel, box)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "launch-form-scrolled.png"))


def test_a_preset_sets_its_fields_and_says_what_it_changed(page):
    page.get_by_role("button", name="Low memory", exact=True).click()
    note = page.locator("#preset-note")
    note.get_by_text("Low memory changed").wait_for(timeout=15_000)
    assert "Method (method) lora → qlora" in note.inner_text()
    assert field(page, "method").input_value() == option_text("method", "qlora")
    assert field(page, "per_device_train_batch_size").input_value() == "1"
    wait_shown(page, "bnb_4bit_quant_type", True)
    page.get_by_role("button", name="Balanced", exact=True).click()
    note.get_by_text("Balanced changed").wait_for(timeout=15_000)
    assert field(page, "method").input_value() == option_text("method", "lora")
    wait_shown(page, "bnb_4bit_quant_type", False)


def test_keyboard_order_follows_the_page(page):
    # Each stop is compared with the one before, both measured after the Tab: the focused field shows
    # all of its help, which moves what lies below it.
    page.get_by_role("button", name="Quick test", exact=True).focus()
    page.evaluate("window.__prevStop = document.activeElement")
    stops = []
    for _ in range(60):
        page.keyboard.press("Tab")
        stops.append(
            page.evaluate("""() => {
            const box = (el) => {
                const r = (el.tagName === 'BUTTON' ? el : el.closest('.block') || el).getBoundingClientRect();
                return {top: Math.round(r.top), bottom: Math.round(r.bottom), left: Math.round(r.left)};
            };
            const el = document.activeElement, prev = window.__prevStop;
            window.__prevStop = el;
            return {here: box(el), before: box(prev), form: !!el.closest('#form-fields'),
                    side: !!el.closest('#launch-side'), id: el.id,
                    text: (el.getAttribute('aria-label') || el.textContent || el.value || '').trim().slice(0, 40)};
        }""")
        )
        if stops[-1]["id"] == "launch-btn":
            break
    first_side = next(i for i, s in enumerate(stops) if s["side"])
    form = [s for s in stops if s["form"]]
    assert len(form) >= 15 and all(not s["form"] for s in stops[first_side:]), stops
    for i in range(1, first_side):  # left to right along a line, then down the page
        if not (stops[i]["form"] and stops[i - 1]["form"]):
            continue
        a, b = stops[i]["before"], stops[i]["here"]
        same_line = a["top"] < b["bottom"] and b["top"] < a["bottom"]
        assert b["left"] > a["left"] if same_line else b["top"] >= a["bottom"] - 2, (stops[i - 1], stops[i])
    assert [s["text"] for s in stops[first_side:]] == [
        "Fit to GPU",
        "Load YAML",
        "Import config",
        "Preview YAML",
        "Launch",
    ]


def test_a_loaded_yaml_fills_the_form_and_the_preview_writes_it_back(page, tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text(
        "run_name: from-yaml\ntrainer: dpo\ndataset: sample:preference-format\nmethod: qlora\n"
        "lora_r: 8\nbeta: 0.25\nmax_steps: 5\n"
    )
    page.locator("#launch-side input[type=file]").first.set_input_files(str(spec))  # Load YAML
    page.wait_for_function(
        """(v) => Array.from(document.querySelectorAll('input')).some(i => i.value === v)""",
        arg="from-yaml",
        timeout=15_000,
    )
    assert (
        field(page, "method").input_value() == option_text("method", "qlora")
        and field(page, "lora_r").input_value() == "8"
    )
    wait_shown(page, "beta", True)
    wait_shown(page, "bnb_4bit_quant_type", True)
    page.get_by_role("button", name="Preview YAML", exact=True).click()
    code = page.locator("#spec-yaml")
    code.get_by_text("run_name: from-yaml").wait_for(timeout=15_000)
    text = code.inner_text()
    assert "beta: 0.25" in text and "lora_r: 8" in text and "method: qlora" in text


def test_an_imported_config_fills_the_form_and_lists_what_was_not_carried_over(page):
    config = Path(__file__).parent / "fixtures" / "imports" / "axolotl_qlora-1b.yml"
    page.locator("#launch-side input[type=file]").nth(1).set_input_files(str(config))  # Import config
    errors = page.locator("#form-errors")
    errors.get_by_text("Imported axolotl config", exact=False).wait_for(timeout=15_000)
    assert "loss_watchdog_threshold" in errors.inner_text()
    assert field(page, "method").input_value() == option_text("method", "qlora")
    assert field(page, "lora_r").input_value() == "32"


def test_numbers_out_of_range_are_all_reported_by_name(page):
    for name, value in (("lora_r", "0"), ("per_device_train_batch_size", "0"), ("learning_rate", "0")):
        box = field(page, name)
        box.fill(value)
        box.press("Tab")
    page.click("#launch-btn")
    errors = page.locator("#form-errors")
    errors.get_by_text("nothing was queued").wait_for(timeout=30_000)
    text = errors.inner_text()
    assert all(n in text for n in ("lora_r", "per_device_train_batch_size", "learning_rate")), text
