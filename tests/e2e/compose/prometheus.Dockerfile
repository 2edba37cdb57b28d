# A Prometheus image from Debian's own package, for tests/e2e/compose_test.sh
# where no image registry is reachable (stands in for prom/prometheus).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus && \
    rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown prometheus /prometheus
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
