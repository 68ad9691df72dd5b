# sluice — make help lists the targets.
SHELL := bash
GO ?= go
CACHE ?= .cache
BIN := bin/sluice

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

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

.PHONY: test
test: ## unit and integration tests with the race detector, one package at a time (the load tests are timing-sensitive; starts redis-server, PostgreSQL and Azurite itself)
	scripts/postgres.sh start >/dev/null
	scripts/azurite.sh start >/dev/null
	$(GO) test -race -count=1 -p 1 ./...; \
		rc=$$?; scripts/postgres.sh stop; scripts/azurite.sh stop; exit $$rc

.PHONY: services-stop
services-stop: ## stop the PostgreSQL and Azurite that tests started
	scripts/postgres.sh stop
	scripts/azurite.sh stop

.PHONY: e2e
e2e: build ## end-to-end tests: real Apache Kafka and redis-server (started here), separate sluice processes
	@command -v kcat >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null; }
	scripts/kafka.sh start
	scripts/redis.sh start
	SLUICE_E2E_BIN=$(abspath $(BIN)) $(GO) test -tags e2e -count=1 -v -timeout 20m ./e2e/ 2>&1 | tee $(CACHE)/e2e.log; \
		rc=$${PIPESTATUS[0]}; scripts/kafka.sh stop; scripts/redis.sh stop; exit $$rc

.PHONY: bench
bench: ## benchmark scenarios 1-9 beside the alternatives (embedded Kafka and Redis; scenario 9, bulk loads of 1 and 5 million rows, starts a real Kafka with scripts/kafka.sh and generates its input in .cache/bench; about 24 min); writes bench/results.json and bench/*.png
	$(GO) run ./cmd/sluice-bench --out bench

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
ci: lint test demo e2e ## what CI runs

.PHONY: clean
clean: ## remove build output and caches
	rm -rf bin $(CACHE)
