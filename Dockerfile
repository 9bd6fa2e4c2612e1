# cronlog node image: `docker build -t cronlog .`
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY core core
COPY eventlog eventlog
COPY archive archive
COPY projections projections
COPY node node
COPY api api
COPY cli cli
COPY tools tools
COPY sdk sdk
RUN pip install --no-cache-dir .
EXPOSE 8080
VOLUME /data
ENTRYPOINT ["cronlog", "serve", "--host", "0.0.0.0", "--port", "8080", "--data-dir", "/data"]
