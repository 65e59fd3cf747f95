# tunedeck image: the web UI (`tunedeck serve`) and the training worker (`tunedeck worker`)
# share it; docker-compose.yml runs one of each on a shared /data volume.
#
#   docker compose up --build                     # CUDA torch from PyPI (Linux x86_64 wheels are CUDA builds)
#   docker compose build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                        --build-arg TORCH_SPEC=torch==2.14.1
FROM python:3.11-slim

# torch is installed on its own, first, so the (large) CUDA layer is cached across code changes.
ARG TORCH_SPEC="torch==2.14.1"
ARG TORCH_INDEX_URL=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"; \
    else \
        pip install "$TORCH_SPEC"; \
    fi

WORKDIR /app
COPY pyproject.toml README.md ./
COPY app ./app
COPY jobs ./jobs
COPY storage ./storage
COPY examples ./examples
# A non-editable install: the image needs no source checkout at run time.
RUN pip install . && python -c "import app.cli.main, jobs.spec.job, storage.store"

# One data directory for database, run artifacts and model cache; a named volume mounted
# here takes this folder's owner, so the unprivileged user can write to it.
RUN useradd --create-home --uid 1000 tunedeck && mkdir -p /data/hf && chown -R tunedeck /data
USER tunedeck
ENV TUNEDECK_HOME=/data \
    HF_HOME=/data/hf \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HUB_DISABLE_TELEMETRY=1
VOLUME /data
EXPOSE 7860

# Off loopback without a login, `serve` makes an access token and prints the URL with it once
# (`docker logs`); set TUNEDECK_AUTH (or --auth-file) for a login instead, TUNEDECK_TOKEN for a token
# of your own (docs/deployment.md#security). /tunedeck/health answers {"status": "ok"} in every mode
# (loopback, token, login) without credentials: the health check asks it.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/tunedeck/health', timeout=5)"
CMD ["tunedeck", "serve", "--host", "0.0.0.0"]
