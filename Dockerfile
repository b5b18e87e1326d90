# kafka-share-proxy container image (docs/deployment.md).
#
#   docker build -t ghcr.io/kafka-share-proxy/kafka-share-proxy:0.1.0 .
#   docker run --rm -p 9092-9093:9092-9093 -p 9404:9404 \
#     -e KSP_UPSTREAM=kafka:9092 -e KSP_ADVERTISED_HOST=localhost \
#     ghcr.io/kafka-share-proxy/kafka-share-proxy:0.1.0
#
# Two stages: `build` installs the project and its pinned dependencies (constraints.txt) into a
# virtualenv; `runtime` is the same slim base with only that virtualenv copied in (no pip cache, no
# source tree, no compilers: every dependency installs from a binary wheel). The same base in both
# stages keeps the venv's interpreter symlinks (/opt/venv/bin/python -> /usr/local/bin/python3.11)
# valid. The base is pinned by exact version tag; pin a digest too where one can be looked up
# (--build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
# What `pip install .` reads, and nothing else (.dockerignore keeps the context to these too).
COPY pyproject.toml README.md constraints.txt ./
COPY proxy/ proxy/
COPY codec/ codec/
COPY client/ client/
COPY spark/ spark/
COPY ksp_testcontainers/ ksp_testcontainers/
# pip and setuptools at the versions constraints.txt names (the venv's own setuptools from
# ensurepip is years old); --build-constraint pins the setuptools that builds the wheel in pip's
# isolated build environment as well. No extras: the image serves, it does not test.
RUN /opt/venv/bin/pip install --no-cache-dir -c constraints.txt --upgrade pip setuptools \
 && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt --build-constraint constraints.txt . \
 && /opt/venv/bin/share-proxy serve --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kafka-share-proxy" \
      org.opencontainers.image.description="A Kafka-protocol proxy that gives any Kafka cluster KIP-932 share groups" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kafka-share-proxy/kafka-share-proxy" \
      org.opencontainers.image.documentation="https://github.com/kafka-share-proxy/kafka-share-proxy/blob/main/docs/deployment.md"
# A fixed uid:gid so Kubernetes' runAsUser/fsGroup and mounted secrets can name it; no home, no shell.
RUN groupadd --system --gid 10001 ksp \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ksp
COPY --from=build /opt/venv /opt/venv
# The image's defaults, then the operator's file: a bind mount or a ConfigMap mounted at the
# directory /etc/kafka-share-proxy replaces the placeholder. Later files override earlier ones key
# by key; KSP_* variables override both, flags (CMD / args) override everything.
COPY docker/defaults.toml /opt/kafka-share-proxy/defaults.toml
COPY docker/proxy.toml /etc/kafka-share-proxy/proxy.toml
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KSP_CONFIG=/opt/kafka-share-proxy/defaults.toml,/etc/kafka-share-proxy/proxy.toml
# Nothing is written to disk at run time: the root filesystem may be read-only.
USER 10001:10001
# Bootstrap 9092; broker N on 9093+N (node ids 0-8 here; publish more for larger ids); metrics and
# health (/metrics, /healthz, /readyz) on 9404.
EXPOSE 9092 9093-9101 9404
# For docker and compose (Kubernetes ignores it and uses the chart's probes): liveness only, so a
# proxy waiting for its upstream is not restarted; readiness is /readyz.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9404/healthz', timeout=4)"]
# Exec form: share-proxy is PID 1 and receives SIGTERM itself (it drains for --shutdown-grace, exits 0).
ENTRYPOINT ["share-proxy", "serve"]
CMD []
