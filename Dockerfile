# NeuroNetes: one image for the CLI, operator, extender and node agent (pick with the command).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . .
RUN pip install . \
    && useradd --system --uid 65532 --no-create-home neuronetes

# Run from a folder that holds no source, so nothing in the repository can shadow a module.
WORKDIR /
USER 65532
ENTRYPOINT ["neuronetes"]
CMD ["--help"]
