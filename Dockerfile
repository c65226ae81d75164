# The codeclog image: CLI, talker, Code2Wav consumer, lag exporter.
# torch from PyPI is the CUDA build, so the same image serves the GPU vocoder.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY codeclog ./codeclog
COPY producers ./producers
COPY consumers ./consumers
COPY schemas ./schemas
COPY vocoder ./vocoder
COPY replay ./replay
COPY lag ./lag
COPY omni ./omni
COPY cli ./cli
COPY devtools ./devtools
COPY kafka ./kafka
COPY testing ./testing
RUN pip install ".[vocoder,metrics]"
USER 65534
ENTRYPOINT []
CMD ["codeclog", "--help"]
