# The two commands the README documents: `make demo` and `make test`.
# Both build the same virtualenv at .venv/ and re-use it while it is sound: a .venv whose
# interpreter no longer runs, is older than Python 3.11, or is not the version an explicit
# PYTHON=... names is removed and built again.

# The interpreter that builds .venv: the first of these that runs and is Python 3.11 or newer
# (`make which-python` shows the choice). `make PYTHON=/path/to/python3.12 ...` names one instead.
PYTHON_CANDIDATES := python3.11 python3.12 python3.13 python3
PYTHON_MIN := 3.11
PYTHON ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Exact versions of every dependency; see the file's header for how to update it.
CONSTRAINTS := constraints.txt
# Kafka versions the project runs against: the newest 4.x and the newest 3.9.x on Maven Central.
KAFKA_VERSION ?= 4.4.0
KAFKA_VERSIONS ?= 4.4.0 3.9.2
# Suites whose subject does not depend on the broker version run against one version only, to keep CI
# inside its budget: the Spark jobs' end-to-end tests (Spark's Kafka source reading the event-log and
# dead-letter topics the proxy wrote; ~4 minutes a run, a Spark JVM per job; the event log itself is
# tested on every version in integration/share/test_event_log.py) and the deployment checks (the image's
# entrypoint and the chart's rendered configuration run against a broker; TLS/SASL and health are tested
# on every version elsewhere). SPARK_KAFKA_VERSION is the older name of the same setting.
SPARK_KAFKA_VERSION ?= 4.4.0
ONE_VERSION_KAFKA ?= $(SPARK_KAFKA_VERSION)
# Also Kafka's share-group tool driving the proxy's own share-group APIs (~2.5 minutes; the tool is
# 4.4's whatever the broker), and the replay-liveness test (400,000 state records replayed while
# /healthz is asked; ~1 minute in CI: the proxy's start-up, the state topic read like any other).
ONE_VERSION_SUITES := integration/spark integration/deploy integration/share/test_share_group_tool.py \
	integration/share/test_state_replay_liveness.py
# The other version runs, alone, the suites whose broker use is ordinary produce/consume, groups and
# transactions, which both versions have: the scale-out suites (several proxy processes, the ownership
# group, transactional state lanes; ~8 minutes) and the dead-letter suite (the proxy's own producer
# writing DLQ topics; ~3 minutes). This balances the two side-by-side suites inside CI's budget.
OTHER_VERSION_KAFKA ?= 3.9.2
OTHER_VERSION_SUITES := integration/share/test_scale_out.py integration/share/test_ownership.py \
	integration/share/test_dead_letters.py
PYTEST_ARGS ?=

.PHONY: venv which-python constraints kafka java spark-jars helm promtool demo test unit integration lint clean bench FORCE

# Prints an interpreter's "MAJOR.MINOR".
VERSION_PROBE := import sys; print("%d.%d" % sys.version_info[:2])
# A shell `case` pattern for the versions accepted: $(PYTHON_MIN) and newer.
SUPPORTED_VERSIONS := 3.1[1-9]|3.[2-9][0-9]|[4-9].*

# Shell code: sets $py to the first interpreter (of $(PYTHON), else of $(PYTHON_CANDIDATES)) that
# runs and reports a supported version, and $pyv to that version; otherwise it says what it tried
# and how to get a Python $(PYTHON_MIN), and exits 1. A candidate that is missing, or a pyenv shim
# for a version that is not active, counts as "unavailable".
FIND_PYTHON = \
  py=""; pyv=""; tried=""; \
  for c in $(or $(PYTHON),$(PYTHON_CANDIDATES)); do \
    v=$$("$$c" -c '$(VERSION_PROBE)' 2>/dev/null) || v=""; \
    case "$$v" in ($(SUPPORTED_VERSIONS)) py=$$c; pyv=$$v; break;; esac; \
    tried="$$tried $$c ($${v:-unavailable})"; \
  done; \
  if [ -z "$$py" ]; then \
    echo "No Python $(PYTHON_MIN) or newer found. Tried:$$tried" >&2; \
    echo "Install one, e.g. 'apt-get install python3.11 python3.11-venv' (Debian/Ubuntu)" >&2; \
    echo "or 'pyenv install 3.11 && pyenv global 3.11', or name one: make PYTHON=/path/to/python3.11 ..." >&2; \
    exit 1; \
  fi

# Why an existing .venv cannot be re-used; empty when it can (or when there is none).
ifneq ($(wildcard $(VENV)),)
VENV_PROBLEM := $(shell \
  have=$$($(BIN)/python -c '$(VERSION_PROBE)' 2>/dev/null) || have=""; \
  want=$$($(if $(PYTHON),"$(PYTHON)" -c '$(VERSION_PROBE)' 2>/dev/null,true)) || want=""; \
  case "$$have" in \
    ("") echo "its interpreter $(BIN)/python does not run";; \
    ($(SUPPORTED_VERSIONS)) [ -z "$$want" ] || [ "$$want" = "$$have" ] || \
      echo "it runs Python $$have but PYTHON=$(PYTHON) is Python $$want";; \
    (*) echo "it runs Python $$have, older than $(PYTHON_MIN)";; \
  esac)
endif

# (Re)installs whenever pyproject.toml or the constraints change, and whenever .venv is unsound.
$(STAMP): pyproject.toml $(CONSTRAINTS) $(if $(VENV_PROBLEM),FORCE)
ifneq ($(VENV_PROBLEM),)
	@echo "Rebuilding $(VENV): $(VENV_PROBLEM)"
	rm -rf $(VENV)
endif
	@if [ ! -x $(BIN)/python ]; then \
	  $(FIND_PYTHON); \
	  echo "Creating $(VENV) with $$py (Python $$pyv)"; \
	  "$$py" -m venv $(VENV) || { rm -rf $(VENV); \
	    echo "'$$py -m venv' failed; on Debian/Ubuntu install python$$pyv-venv" >&2; exit 1; }; \
	fi
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c $(CONSTRAINTS) --upgrade pip setuptools
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c $(CONSTRAINTS) --no-build-isolation -e '.[test,spark]'
	@touch $@

# With PYTHON=... given, check it even when .venv needs no rebuilding.
venv: $(if $(PYTHON),which-python) $(STAMP)

FORCE:

which-python:
	@$(FIND_PYTHON); echo "$$py (Python $$pyv)"

# Re-pin $(CONSTRAINTS) to the newest releases pyproject.toml allows: a scratch virtualenv installs
# the project without constraints and its `pip freeze` (header comments kept) becomes the new file.
# Review `git diff $(CONSTRAINTS)`, then run `make test`.
constraints:
	@$(FIND_PYTHON); \
	scratch=$$(mktemp -d) && trap 'rm -rf "$$scratch"' EXIT && \
	echo "Installing the newest releases pyproject.toml allows into a scratch venv ($$py, Python $$pyv)" && \
	"$$py" -m venv "$$scratch/venv" && \
	"$$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip setuptools && \
	"$$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation -e '.[test,spark]' && \
	{ sed '/^[^#]/,$$d' $(CONSTRAINTS); \
	  "$$scratch/venv/bin/python" -m pip freeze --all --exclude-editable | grep -v -e '^#' -e '^-e' -e '^wheel=='; \
	} > "$$scratch/constraints.txt" && \
	cp "$$scratch/constraints.txt" $(CONSTRAINTS) && \
	echo "$(CONSTRAINTS) updated; review 'git diff $(CONSTRAINTS)', then run 'make test'"

# Fetch and cache the Kafka jars for every version the tests use (skipped when cached).
kafka: venv
	for v in $(KAFKA_VERSIONS); do $(BIN)/share-proxy fetch-kafka --kafka-version $$v || exit 1; done

# Resolve the Spark Kafka connector's jars from Maven Central (spark/ivysettings.xml) into the Ivy cache,
# so Spark jobs and their tests never download mid-run (skipped when cached).
SPARK_IVY := $(HOME)/.cache/kafka-share-proxy/ivy
SPARK_CONNECTOR_JAR := $(SPARK_IVY)/jars/org.apache.spark_spark-sql-kafka-0-10_2.13-4.2.0.jar
spark-jars: venv
	@if [ -f "$(SPARK_CONNECTOR_JAR)" ]; then echo "Spark Kafka connector jars cached in $(SPARK_IVY)"; \
	else $(BIN)/share-proxy spark fetch-jars; fi

# helm, for the chart checks (tests/helm, integration/deploy): built from its Go module source at a
# pinned version into a cache outside the repository (cold ~2 minutes; skipped when cached). Without
# `go` this says so and succeeds: the chart tests then skip with the same reason. The tests find the
# binary at $(HELM) or at $$KSP_HELM.
HELM_VERSION := v3.22.0
HELM_DIR := $(HOME)/.cache/kafka-share-proxy/helm-$(HELM_VERSION)
HELM := $(HELM_DIR)/helm
helm:
	@if [ -x "$(HELM)" ]; then echo "helm $(HELM_VERSION) cached at $(HELM)"; \
	elif ! command -v go >/dev/null 2>&1; then \
	  echo "go is not installed: helm $(HELM_VERSION) not built, the chart tests (tests/helm) will be skipped."; \
	  echo "Install Go (https://go.dev/dl/) and run 'make helm', or point KSP_HELM at a helm $(HELM_VERSION) binary."; \
	else \
	  echo "Building helm $(HELM_VERSION) with 'go install' into $(HELM_DIR) (a few minutes the first time)"; \
	  GOBIN="$(HELM_DIR)" go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); \
	fi

# promtool, Prometheus's rule checker, to evaluate the chart's alert rules (tests/helm/test_alert_rules.py):
# built like helm, but not by `make test` -- cold it takes ~5.5 minutes on two cores, more than CI's
# 45-minute budget has to spare. Without it those tests skip and say so. Found at $(PROMTOOL) or
# at $$KSP_PROMTOOL. (Prometheus's Go module versions are v0.<major><minor>.<patch>: v0.316.0 is 3.16.0.)
PROMTOOL_VERSION := v0.316.0
PROMTOOL_DIR := $(HOME)/.cache/kafka-share-proxy/promtool-$(PROMTOOL_VERSION)
PROMTOOL := $(PROMTOOL_DIR)/promtool
promtool:
	@if [ -x "$(PROMTOOL)" ]; then echo "promtool $(PROMTOOL_VERSION) cached at $(PROMTOOL)"; \
	elif ! command -v go >/dev/null 2>&1; then \
	  echo "go is not installed: promtool not built; install Go (https://go.dev/dl/) or set KSP_PROMTOOL."; exit 1; \
	else \
	  echo "Building promtool $(PROMTOOL_VERSION) with 'go install' into $(PROMTOOL_DIR) (~5 minutes the first time)"; \
	  GOBIN="$(PROMTOOL_DIR)" go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION); \
	fi

# Build the Java drivers used by integration tests (skipped when up to date).
java: venv
	$(BIN)/python -m integration.java.build

demo: venv spark-jars
	@echo "Fetching Apache Kafka $(KAFKA_VERSION) jars with Maven (skipped when cached)"
	$(BIN)/share-proxy fetch-kafka --kafka-version $(KAFKA_VERSION)
	$(BIN)/python -m proxy.demo --kafka-version $(KAFKA_VERSION)

lint: venv
	$(BIN)/lint-imports

unit: venv lint helm
	$(BIN)/pytest -q tests $(PYTEST_ARGS)

# The per-version suites run side by side (INTEGRATION_JOBS=2, the default; 1 runs them one after the
# other): each is mostly waiting on its own broker's JVM and on client time-outs, so two at once finish in
# about the time of the longer one on a 2-core machine. Each suite has its own broker, proxies and free
# ports; its output goes to build/integration/kafka-VERSION.log and is printed when it ends.
INTEGRATION_JOBS ?= 2
INTEGRATION_LOGS := build/integration

integration: venv kafka java spark-jars helm
	@run_suite() { \
	  skip=""; [ "$$1" = "$(ONE_VERSION_KAFKA)" ] || skip="$(addprefix --ignore=,$(ONE_VERSION_SUITES))"; \
	  [ "$$1" = "$(OTHER_VERSION_KAFKA)" ] || skip="$$skip $(addprefix --ignore=,$(OTHER_VERSION_SUITES))"; \
	  KSP_KAFKA_VERSION=$$1 $(BIN)/pytest -q -p no:cacheprovider --durations=20 integration $$skip $(PYTEST_ARGS); \
	}; \
	if [ "$(INTEGRATION_JOBS)" = 1 ]; then \
	  for v in $(KAFKA_VERSIONS); do \
	    echo "=== integration suite against Apache Kafka $$v ==="; run_suite $$v || exit 1; \
	  done; \
	else \
	  mkdir -p $(INTEGRATION_LOGS); jobs=""; \
	  for v in $(KAFKA_VERSIONS); do \
	    echo "=== integration suite against Apache Kafka $$v: started, output in $(INTEGRATION_LOGS)/kafka-$$v.log ==="; \
	    ( start=$$(date +%s); run_suite $$v; rc=$$?; \
	      echo "suite exit status $$rc after $$(( $$(date +%s) - start )) s"; exit $$rc ) > $(INTEGRATION_LOGS)/kafka-$$v.log 2>&1 & \
	    jobs="$$jobs $$!:$$v"; \
	  done; \
	  failed=""; \
	  for job in $$jobs; do \
	    v=$${job#*:}; if wait $${job%%:*}; then result=passed; else result=FAILED; failed="$$failed $$v"; fi; \
	    echo "=== integration suite against Apache Kafka $$v: $$result ==="; cat $(INTEGRATION_LOGS)/kafka-$$v.log; \
	  done; \
	  if [ -n "$$failed" ]; then echo "integration suites failed against Kafka:$$failed" >&2; exit 1; fi; \
	fi

test: unit integration

clean:
	rm -rf $(VENV) build *.egg-info
