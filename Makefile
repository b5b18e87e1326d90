# The two commands the README documents: `make demo` and `make test`.
# Both build the same virtualenv at .venv/ and re-use what is already there.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Kafka versions the project runs against: the newest 4.x and the newest 3.9.x on Maven Central.
KAFKA_VERSION ?= 4.4.0
KAFKA_VERSIONS ?= 4.4.0 3.9.2
PYTEST_ARGS ?=

.PHONY: venv kafka java demo test unit integration lint clean bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Fetch and cache the Kafka jars for every version the tests use (skipped when cached).
kafka: venv
	for v in $(KAFKA_VERSIONS); do $(BIN)/share-proxy fetch-kafka --kafka-version $$v || exit 1; done

# Build the Java drivers used by integration tests (skipped when up to date).
java:
	$(BIN)/python -m integration.java.build

demo: venv
	$(BIN)/share-proxy fetch-kafka --kafka-version $(KAFKA_VERSION)
	$(BIN)/python -m proxy.demo --kafka-version $(KAFKA_VERSION)

lint: venv
	$(BIN)/lint-imports

unit: venv lint
	$(BIN)/pytest -q tests $(PYTEST_ARGS)

integration: venv kafka java
	for v in $(KAFKA_VERSIONS); do \
	  echo "=== integration suite against Apache Kafka $$v ==="; \
	  KSP_KAFKA_VERSION=$$v $(BIN)/pytest -q integration $(PYTEST_ARGS) || exit 1; \
	done

test: unit integration

clean:
	rm -rf $(VENV) build *.egg-info
