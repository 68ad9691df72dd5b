# sluice — make help lists the targets.
SHELL := bash
GO ?= go
CACHE ?= .cache
BIN := bin/sluice

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z][a-z0-9-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

.PHONY: build
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)

build: ## build bin/sluice (sluice --version names the git revision)
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.revision=$(REVISION)" -o $(BIN) ./cmd/sluice

.PHONY: demo
demo: build ## bulk-load the USGS earthquakes through embedded Kafka, Redis and a sink throttled at 2,000 records/s
	@mkdir -p $(CACHE)
	$(BIN) bulk-load --embedded --capacity 2000 --partitions 20 --workers 2 \
		--topic earthquakes --id-field id --summary-json $(CACHE)/demo-summary.json \
		testdata/usgs-earthquakes-2025-05.csv
	@echo "summary written to $(CACHE)/demo-summary.json"

# The packages with budgets (tests named Budget…): allocations, Redis
# commands, heap; run without the race detector, which adds allocations.
BUDGETS = ./pipeline/ ./worker/ ./bulkload/
# The packages make test runs with the race detector. make ci leaves out
# the e2e package, whose service-free tests (the chart, compose, alerts,
# dashboard, build context) make e2e runs beside the rest of it: once is
# enough, and under the race detector they took about two minutes.
TEST_PACKAGES ?= ./...

.PHONY: test
test: services-start ## unit and integration tests with the race detector, one package at a time (starts redis-server, PostgreSQL, Azurite, json-server, DynamoDB Local, MinIO, fake-gcs-server and OpenSearch itself)
	( $(GO) test -count=1 -run Budget $(BUDGETS); rc=$$?; \
		$(GO) test -race -count=1 -p 1 $(TEST_PACKAGES) || rc=1; exit $$rc ) 2>&1 | tee $(CACHE)/test.log; \
		rc=$${PIPESTATUS[0]}; $(MAKE) --no-print-directory services-stop; \
		[ $$rc -eq 0 ] || scripts/failures.sh $(CACHE)/test.log; exit $$rc

.PHONY: services-start
services-start: ## start the PostgreSQL, Azurite, json-server, DynamoDB Local, MinIO, fake-gcs-server and OpenSearch that the sinks' tests and benchmarks use
	@mkdir -p $(CACHE)
	scripts/postgres.sh start >/dev/null
	scripts/azurite.sh start >/dev/null
	scripts/jsonserver.sh start >/dev/null
	scripts/dynamodb.sh start >/dev/null
	scripts/s3.sh start >/dev/null
	scripts/gcs.sh start >/dev/null
	scripts/opensearch.sh start >/dev/null

.PHONY: services-stop
services-stop: ## stop the PostgreSQL, Azurite, json-server, DynamoDB Local, MinIO, fake-gcs-server and OpenSearch that tests started
	scripts/postgres.sh stop
	scripts/azurite.sh stop
	scripts/jsonserver.sh stop
	scripts/dynamodb.sh stop
	scripts/s3.sh stop
	scripts/gcs.sh stop
	scripts/opensearch.sh stop

# make e2e starts the broker and redis-server in their secured modes: the
# broker's SASL_SSL, SSL and mTLS listeners (client port + 2, 3, 4) beside
# its plaintext one, and redis-server with an ACL user, TLS (port + 1) and a
# Sentinel (port + 2). The cases that are not about security use the
# plaintext listener and reach Redis as its ACL user (keys sluice:* only).
# SLUICE_KAFKA_SECURE stays set for the tests, so that the case that
# restarts the broker restarts it secured. A Redis Cluster of 3 masters
# and 3 replicas (TLS only, the same ACL user) runs beside them on
# SLUICE_REDIS_CLUSTER_PORT .. + 5 (17000); its seeds, the script's last
# line, reach the tests as SLUICE_E2E_REDIS_CLUSTER. SLUICE_REDIS_CLUSTER
# is 0 but where the cluster is meant (a shell that exported it for the
# script would otherwise turn every redis.sh call and sluice process to
# the cluster).
E2E_KAFKA_PORT = $(or $(SLUICE_KAFKA_PORT),19092)
E2E_REDIS_PORT = $(or $(SLUICE_REDIS_PORT),16379)
E2E_REDIS_URL = redis://$(or $(SLUICE_REDIS_USERNAME),sluice):$(or $(SLUICE_REDIS_PASSWORD),sluice-test-password)@127.0.0.1:$(E2E_REDIS_PORT)

.PHONY: e2e
e2e: export SLUICE_KAFKA_SECURE = 1
e2e: export SLUICE_REDIS_CLUSTER = 0
e2e: build ## end-to-end tests: real Apache Kafka and redis-server (secured listeners included) and a Redis Cluster (3 masters, 3 replicas), DynamoDB Local, MinIO, fake-gcs-server and OpenSearch (started here), separate sluice processes, the release image built without Docker and run under podman; the queue package and the security tests against them too (the REST sink's tests start their own json-server)
	@command -v kcat >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null; }
	@command -v openssl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; } # the secured modes' test certificates
	@mkdir -p $(CACHE)
	scripts/kafka.sh start
	SLUICE_REDIS_SECURE=1 scripts/redis.sh start
	SLUICE_REDIS_CLUSTER=1 SLUICE_REDIS_SECURE=1 scripts/redis.sh start >$(CACHE)/redis-cluster.seeds
	scripts/dynamodb.sh start >/dev/null
	scripts/s3.sh start >/dev/null
	scripts/gcs.sh start >/dev/null
	scripts/opensearch.sh start >/dev/null
	( rc=0; \
		SLUICE_TEST_BROKERS=127.0.0.1:$(E2E_KAFKA_PORT) $(GO) test -race -tags e2e -count=1 ./queue/ || rc=1; \
		$(GO) test -race -tags e2e -count=1 -run Secure ./lease/ || rc=1; \
		SLUICE_E2E_BIN=$(abspath $(BIN)) SLUICE_E2E_BROKERS=127.0.0.1:$(E2E_KAFKA_PORT) SLUICE_E2E_REDIS_ADDR='$(E2E_REDIS_URL)' \
			SLUICE_E2E_REDIS_CLUSTER="$$(tail -n 1 $(CACHE)/redis-cluster.seeds)" \
			$(GO) test -tags e2e -count=1 -v -timeout 30m ./e2e/ || rc=1; \
		exit $$rc ) 2>&1 | tee $(CACHE)/e2e.log; \
		rc=$${PIPESTATUS[0]}; scripts/kafka.sh stop; scripts/redis.sh stop; SLUICE_REDIS_CLUSTER=1 scripts/redis.sh stop; scripts/dynamodb.sh stop; scripts/s3.sh stop; \
		scripts/gcs.sh stop; scripts/opensearch.sh stop; \
		[ $$rc -eq 0 ] || scripts/failures.sh $(CACHE)/e2e.log; exit $$rc

.PHONY: image
image: ## build the release image without Docker (scratch layers, .cache/image) and load it into podman, installed when missing; scripts/image.sh run|demo runs it with a read-only root
	VERSION=$(VERSION) REVISION=$(REVISION) SLUICE_CACHE=$(CACHE) scripts/image.sh load

.PHONY: bench
bench: ## benchmark scenarios 1-10 beside the alternatives (embedded Kafka and Redis; scenarios 5 and 9 start a real Kafka with scripts/kafka.sh, 9 generating its 1 and 5 million rows in .cache/bench; scenario 10 a real redis-server with scripts/redis.sh; about 24 min); writes bench/results.json and bench/*.png
	$(GO) run ./cmd/sluice-bench --out bench

.PHONY: bench-sinks
bench-sinks: services-start ## unthrottled writes per sink (records/s by batch size): the emulator, a REST API, PostgreSQL, Azurite, DynamoDB Local, MinIO, fake-gcs-server and OpenSearch (started here)
	$(GO) test -run '^$$' -bench 'Write$$' -benchtime 2s ./sink/ 2>&1 | tee $(CACHE)/bench-sinks.log; \
		rc=$${PIPESTATUS[0]}; $(MAKE) --no-print-directory services-stop; exit $$rc

.PHONY: bench-api
bench-api: build ## load test of sluice api against a real Kafka broker (started here): records/s and p50/p99 latency, 16 clients, batches of 100, 10 s
	scripts/kafka.sh start
	SLUICE_E2E_BIN=$(abspath $(BIN)) $(GO) test -tags e2e -count=1 -run '^$$' -bench APIIntake -benchtime 1x ./e2e/ 2>&1 | tee $(CACHE)/bench-api.log; \
		rc=$${PIPESTATUS[0]}; scripts/kafka.sh stop; exit $$rc

.PHONY: lint
lint: ## gofmt, go vet, and go mod tidy leaving no diff
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) mod tidy -diff

.PHONY: ci
ci: TEST_PACKAGES = $(shell $(GO) list ./... | grep -v '/e2e$$')
ci: lint test demo e2e ## what CI runs (the e2e package's service-free tests once, in make e2e)

.PHONY: clean
clean: ## remove build output and caches
	rm -rf bin $(CACHE)

.PHONY: docs
docs: ## regenerate the CLI reference (docs/cli.md) from the app
	$(GO) test -count=1 -run TestCLIReferenceIsCurrent ./cmd/sluice -update
