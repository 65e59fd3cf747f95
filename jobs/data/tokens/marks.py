"""The token view's marks (`jobs.data.tokens.view`): each token of a training sequence, trained or masked, cut or kept.

views[0].sequences[0].tokens[3].trained          # True: this token is in the loss
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.errors import Problem, ProblemError


class ViewUnavailable(ProblemError):
    """The token view cannot show this spec's rows (a trainer or a row format it does not cover yet)."""

    subject = "with the token view"

    def __init__(self, field_name: str, problem: str) -> None:
        fix = "check the data with `tunedeck submit` (its checks still run); the view shows text rows and sft's image rows"
        super().__init__([Problem(field_name, problem, fix)])


@dataclass(frozen=True)
class Token:
    id: int
    text: str  # the token's own piece of text, as the tokenizer decodes it alone
    special: bool  # one of the tokenizer's special tokens (EOS, end-of-turn, BOS, pad)
    trained: bool  # in the loss: the collator's label is not -100 (dpo: its completion_mask is 1)
    cut: bool = False  # past max_length: truncation removes it, the model never sees it


@dataclass(frozen=True)
class TokenSequence:
    name: str  # "text" (sft), "chosen", "rejected" (dpo, orpo, cpo, reward), "completion (desirable)" (kto), "prompt"
    tokens: tuple[Token, ...]
    image_blocks: tuple[tuple[int, int], ...] = ()  # sft image rows: (first position, length) of each image's tokens

    @property
    def kept(self) -> list[Token]:
        return [t for t in self.tokens if not t.cut]

    @property
    def trained_positions(self) -> list[int]:
        """The positions (in the kept sequence) whose token is in the loss."""
        return [i for i, t in enumerate(self.kept) if t.trained]

    @property
    def cut_count(self) -> int:
        return sum(t.cut for t in self.tokens)


@dataclass(frozen=True)
class RowView:
    index: int  # the row's position in the rows given
    sequences: tuple[TokenSequence, ...]
    dropped: bool = False  # trl drops the row: no token of it is left in the loss after truncation
    untrained: bool = False  # no token of the row is in the loss even before the cut (its masks hide it all)
    prompt_tokens: int = 0  # dpo, kto, orpo, cpo, grpo: the prompt's length
    notes: list[str] = field(default_factory=list)

    @property
    def trained_count(self) -> int:
        return sum(len(s.trained_positions) for s in self.sequences)


def token_of(tokenizer: Any, token_id: int, trained: bool, cut: bool, special: set[int]) -> Token:
    return Token(int(token_id), tokenizer.decode([int(token_id)]), int(token_id) in special, trained, cut)
