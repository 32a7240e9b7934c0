# immortal-operator: build, test, run locally, demo against the test API server, deploy.
# `make` (or `make help`) lists the targets.

# Image for docker-build and deploy, e.g. make deploy IMG=ghcr.io/me/immortal-operator:v0.1.0
IMG ?= immortal-operator:latest
KUBECTL ?= kubectl
CARGO ?= cargo
CONTAINER_TOOL ?= docker
# Extra operator flags for run and demo, e.g. make run ARGS="--namespace team-a --workers 4"
ARGS ?=
# make run's probe and metrics listeners: this machine only, unless ARGS names the flag (a
# laptop on a shared network should not serve its probes and metrics to it). In a cluster the
# Deployment's defaults (every interface) are what the kubelet and Prometheus need.
RUN_PROBE_ADDR ?= 127.0.0.1:8081
RUN_METRICS_ADDR ?= 127.0.0.1:8443

comma := ,
# Where cargo puts binaries: honour CARGO_TARGET_DIR as cargo does.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
# The demo's files: kubeconfig, pids, logs (tests point it elsewhere).
DEMO_DIR ?= .demo
DEMO_KUBECTL := $(KUBECTL) --kubeconfig $(DEMO_DIR)/kubeconfig
# What stops this demo: a demo elsewhere than .demo is stopped only with its own DEMO_DIR (a
# bare make demo-stop would stop the one in .demo).
DEMO_STOP := make demo-stop$(if $(filter-out .demo,$(DEMO_DIR)), DEMO_DIR=$(DEMO_DIR))
# The demo operator's probe and metrics listeners: this machine only, on ports the kernel picks
# (printed once bound), so that a port another program holds cannot take the demo down.
DEMO_PROBE_ADDR ?= 127.0.0.1:0
DEMO_METRICS_ADDR ?= 127.0.0.1:0
# How long make demo waits for both processes to be up and the sample to have its pod.
DEMO_WAIT ?= 60
SAMPLE := config/samples/immortalcontainer.yaml

# `alive PID` in a recipe: the process runs. A zombie (exited, not yet reaped by whoever
# inherited it) does not count, so a dead demo process is never reported running.
ALIVE = alive() { s=$$(ps -o stat= -p "$$1" 2>/dev/null); [ -n "$$s" ] && [ "$${s\#Z}" = "$$s" ]; };

.DEFAULT_GOAL := help
.PHONY: help build build-static test test-real run demo demo-stop install uninstall render deploy undeploy \
	undeploy-operator load-image deploy-local \
	build-installer docker-build docker-buildx fmt lint generate bench bench-large lines

help: ## List the targets
	@echo 'Usage: make TARGET [IMG=...] [ARGS=...]'
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The release binaries make build, run, demo and the tests use: one cargo command line, since
# cargo resolves features per command line and two could each rebuild what the other built.
RELEASE_BUILD = $(CARGO) build --release -p immortal-operator -p kube-testserver

build: ## Build the release binaries (the operator and the test API server)
	$(RELEASE_BUILD)

# The static musl binary is what the image ships: it maps no libc, which is 1.5 MiB of resident
# memory (idle 2.7 instead of 4.25 MiB, make bench 2026-11-23). Needs the musl target
# (rustup target add $(MUSL_TARGET)) and musl-gcc (Debian: musl-tools) for ring's C code.
MUSL_TARGET := $(shell uname -m)-unknown-linux-musl
# Asked where the installed targets live (its sysroot), with or without rustup.
RUSTC ?= rustc
# The cc crate compiles ring's C with CC_<target> when set; name Debian's musl-gcc, as the image
# does, unless the environment already names a compiler.
MUSL_CC_VAR := CC_$(subst -,_,$(MUSL_TARGET))
$(MUSL_CC_VAR) ?= musl-gcc
export $(MUSL_CC_VAR)
build-static: ## Build the static (musl) release binary the image ships
	@# Checked first, as make bench does: without them rustc says only E0463 or cc fails deep in ring.
	@if [ ! -d "$$($(RUSTC) --print sysroot 2>/dev/null)/lib/rustlib/$(MUSL_TARGET)" ]; then \
		echo 'make build-static: the Rust standard library for $(MUSL_TARGET) is not installed; run: rustup target add $(MUSL_TARGET)' >&2; \
		exit 1; \
	fi
	@cc="$$$(MUSL_CC_VAR)"; if ! command -v "$${cc%% *}" >/dev/null 2>&1; then \
		echo "make build-static: no C compiler $$$(MUSL_CC_VAR) for ring's C code (Debian, Ubuntu: apt-get install musl-tools; or set $(MUSL_CC_VAR))" >&2; \
		exit 1; \
	fi
	$(CARGO) build --release --target $(MUSL_TARGET) -p immortal-operator

test: ## Run the whole test suite (cargo-nextest if installed), then the real-cluster tier (KUBE_ASSETS)
	@# nextest does not run doctests, so they get their own cargo test --doc pass. The real
	@# tier runs whatever the first part says, and the target fails if either did.
	@status=0; if $(CARGO) nextest --version >/dev/null 2>&1; then \
		echo '$(CARGO) nextest run --workspace && $(CARGO) test --workspace --doc'; \
		$(CARGO) nextest run --workspace && $(CARGO) test --workspace --doc || status=1; \
	else \
		echo '$(CARGO) test --workspace'; \
		$(CARGO) test --workspace || status=1; \
	fi; \
	$(MAKE) --no-print-directory test-real || status=1; \
	exit $$status

# The real-cluster tier: a Kubernetes control plane with one node from the binaries in
# KUBE_ASSETS (kube-apiserver, kube-controller-manager, kube-scheduler and kubemark, as envtest
# takes KUBEBUILDER_ASSETS; etcd on PATH), on which the CRD, the RBAC, the installer, deploy and
# undeploy are applied and the end-to-end suite E2E_TESTS runs (docs/testing.md).
KUBE_ASSETS ?=
E2E_TESTS := e2e endings day2 production leader template network watch_stall
test-real: ## Run deploy, undeploy and the end-to-end suite on a real control plane from KUBE_ASSETS
	@if [ -z '$(KUBE_ASSETS)' ]; then \
		echo 'make test: the real-cluster tier is skipped: KUBE_ASSETS names no directory of kube-apiserver, kube-controller-manager, kube-scheduler and kubemark (docs/testing.md)'; \
		exit 0; \
	fi; \
	KUBE_ASSETS='$(KUBE_ASSETS)' E2E_TESTS='$(E2E_TESTS)' CARGO='$(CARGO)' KUBECTL='$(KUBECTL)' \
		tests/real-cluster.sh tier

run: ## Run the operator locally with $KUBECONFIG or ~/.kube/config (none: make demo)
	@flags=; \
	case ' $(ARGS)' in *' --health-probe-bind-address'*) ;; \
		*) flags="$$flags --health-probe-bind-address $(RUN_PROBE_ADDR)" ;; esac; \
	case ' $(ARGS)' in *' --metrics-bind-address'*) ;; \
		*) flags="$$flags --metrics-bind-address $(RUN_METRICS_ADDR)" ;; esac; \
	cluster=; if [ -n "$$KUBECONFIG" ] || [ -f "$$HOME/.kube/config" ]; then cluster=1; fi; \
	case ' $(ARGS)' in *' --kubeconfig'*) cluster=1 ;; esac; \
	if [ -n "$$cluster" ]; then \
		echo '$(RELEASE_BUILD)'; $(RELEASE_BUILD) || exit 1; \
		echo "$(TARGET_DIR)/release/immortal-operator$$flags $(ARGS)"; \
		exec $(TARGET_DIR)/release/immortal-operator $$flags $(ARGS); \
	else \
		echo 'no kubeconfig ($$KUBECONFIG unset, no ~/.kube/config): running make demo'; \
		$(MAKE) --no-print-directory demo; \
	fi

demo: ## Start the test API server and the operator in the background, create the sample
	@mkdir -p $(DEMO_DIR)
	@$(ALIVE) for p in server operator; do \
		if [ -f $(DEMO_DIR)/$$p.pid ] && alive "$$(cat $(DEMO_DIR)/$$p.pid)"; then \
			echo 'a demo is already running in $(DEMO_DIR): $(DEMO_STOP) first'; exit 1; \
		fi; \
	done
	$(RELEASE_BUILD)
	@# A stale kubeconfig from an earlier run must not be mistaken for the new server's.
	@rm -f $(DEMO_DIR)/kubeconfig $(DEMO_DIR)/server.pid $(DEMO_DIR)/operator.pid
	@# The previous run's logs stay, one run back (demo-stop keeps them for trace).
	@for p in server operator; do \
		if [ -f $(DEMO_DIR)/$$p.log ]; then \
			mv -f $(DEMO_DIR)/$$p.log $(DEMO_DIR)/$$p.log.1; \
			echo "the previous run's $$p log is $(DEMO_DIR)/$$p.log.1"; \
		fi; \
	done
	nohup $(TARGET_DIR)/release/kube-testserver --dir $(DEMO_DIR) \
		--crd config/crd/immortalcontainers.yaml > $(DEMO_DIR)/server.log 2>&1 & \
		echo $$! > $(DEMO_DIR)/server.pid
	@# The server writes its kubeconfig once it is listening; wait for it (at most 30s).
	@$(ALIVE) i=0; until [ -s $(DEMO_DIR)/kubeconfig ]; do \
		if ! alive "$$(cat $(DEMO_DIR)/server.pid)"; then \
			echo 'kube-testserver exited; $(DEMO_DIR)/server.log says:'; \
			tail -n 20 $(DEMO_DIR)/server.log; rm -f $(DEMO_DIR)/server.pid; exit 1; \
		fi; \
		i=$$((i + 1)); \
		if [ $$i -gt 150 ]; then \
			echo 'no $(DEMO_DIR)/kubeconfig after 30s; see $(DEMO_DIR)/server.log'; \
			$(MAKE) --no-print-directory demo-stop; exit 1; \
		fi; \
		sleep 0.2; \
	done
	@# Loopback listeners and plain-HTTP metrics (nothing but this machine can reach them),
	@# unless ARGS says otherwise.
	@flags=; \
	case ' $(ARGS)' in *' --health-probe-bind-address'*) ;; \
		*) flags="$$flags --health-probe-bind-address $(DEMO_PROBE_ADDR)" ;; esac; \
	case ' $(ARGS)' in *' --metrics-bind-address'*) ;; \
		*) flags="$$flags --metrics-bind-address $(DEMO_METRICS_ADDR)" ;; esac; \
	case ' $(ARGS)' in *' --metrics-secure'*) ;; *) flags="$$flags --metrics-secure=false" ;; esac; \
	echo "nohup $(TARGET_DIR)/release/immortal-operator --kubeconfig $(DEMO_DIR)/kubeconfig$$flags $(ARGS) > $(DEMO_DIR)/operator.log 2>&1 &"; \
	nohup $(TARGET_DIR)/release/immortal-operator --kubeconfig $(DEMO_DIR)/kubeconfig $$flags $(ARGS) \
		> $(DEMO_DIR)/operator.log 2>&1 & \
		echo $$! > $(DEMO_DIR)/operator.pid
	@# Retried briefly: the kubeconfig can appear a moment before the server answers.
	@i=0; until $(DEMO_KUBECTL) create -f $(SAMPLE); do \
		if $(DEMO_KUBECTL) get -f $(SAMPLE) >/dev/null 2>&1; then break; fi; \
		i=$$((i + 1)); \
		if [ $$i -ge 10 ]; then \
			echo 'could not create the sample; stopping the demo'; \
			$(MAKE) --no-print-directory demo-stop; exit 1; \
		fi; \
		sleep 1; \
	done
	@# Running means: both processes alive and the sample's pod made by the operator. Say so
	@# only then; otherwise say why, from the log of what died, and stop what was started.
	@$(ALIVE) i=0; while :; do \
		for p in server operator; do \
			if ! alive "$$(cat $(DEMO_DIR)/$$p.pid)"; then \
				echo "the demo's $$p exited; the end of $(DEMO_DIR)/$$p.log:"; \
				tail -n 20 $(DEMO_DIR)/$$p.log | sed 's/^/  /'; \
				$(MAKE) --no-print-directory demo-stop >/dev/null; exit 1; \
			fi; \
		done; \
		pod=$$($(DEMO_KUBECTL) get -f $(SAMPLE) -o 'jsonpath={.status.currentPod}' 2>/dev/null); \
		if [ -n "$$pod" ] && $(DEMO_KUBECTL) get pod "$$pod" >/dev/null 2>&1; then break; fi; \
		i=$$((i + 1)); \
		if [ $$i -ge $$(( $(DEMO_WAIT) * 2 )) ]; then \
			echo "the sample has no pod after $(DEMO_WAIT)s (status.currentPod: '$$pod');" \
				'the end of $(DEMO_DIR)/operator.log:'; \
			tail -n 20 $(DEMO_DIR)/operator.log | sed 's/^/  /'; \
			$(MAKE) --no-print-directory demo-stop >/dev/null; exit 1; \
		fi; \
		sleep 0.5; \
	done
	@bound() { sed -n "s/.*serving $$1.*address[=\":]*\([0-9.]*:[0-9]*\).*/\1/p" $(DEMO_DIR)/operator.log | head -n 1; }; \
	probes=$$(bound probes); metrics=$$(bound metrics); \
	echo; \
	echo "The demo is running: kube-testserver (pid $$(cat $(DEMO_DIR)/server.pid))," \
		"immortal-operator (pid $$(cat $(DEMO_DIR)/operator.pid)); the sample's pod is" \
		"$$($(DEMO_KUBECTL) get -f $(SAMPLE) -o 'jsonpath={.status.currentPod}')."; \
	[ -z "$$probes" ] || echo "Probes: curl http://$$probes/readyz"; \
	[ -z "$$metrics" ] || echo "Metrics: curl http://$$metrics/metrics"; \
	echo 'Watch it work:'; \
	echo '  $(DEMO_KUBECTL) get ic,pods'; \
	echo '  $(DEMO_KUBECTL) delete pod example-immortalpod   # comes back; STARTS goes up'; \
	echo '  $(DEMO_KUBECTL) get ic,pods'; \
	echo '  tail -f $(DEMO_DIR)/operator.log'; \
	echo '  $(TARGET_DIR)/release/immortal-operator trace default/example --log $(DEMO_DIR)/operator.log'; \
	echo 'Stop it: $(DEMO_STOP)'

demo-stop: ## Stop the demo's operator and test API server, and remove their kubeconfig
	@# Only signal a pid that still runs one of our binaries, never a process that reused it;
	@# wait for it to end (the operator takes up to 7 s), and SIGKILL what outlives 15 s.
	@$(ALIVE) found=; for p in operator server; do \
		f=$(DEMO_DIR)/$$p.pid; [ -f $$f ] || continue; pid=$$(cat $$f); found=1; \
		case "$$(ps -p "$$pid" -o comm= 2>/dev/null)" in \
		*immortal-oper*|*kube-testserv*) \
			kill "$$pid" 2>/dev/null; i=0; \
			while alive "$$pid" && [ $$i -lt 75 ]; do sleep 0.2; i=$$((i + 1)); done; \
			if alive "$$pid"; then kill -9 "$$pid" 2>/dev/null; echo "killed $$p (pid $$pid)"; \
			else echo "stopped $$p (pid $$pid)"; fi ;; \
		*) echo "$$p (pid $$pid) was not running" ;; \
		esac; \
		rm -f $$f; \
	done; \
	[ -n "$$found" ] || echo 'no demo was running in $(DEMO_DIR)'
	@# The kubeconfig and certificates belong to a server that is gone; the logs stay for trace.
	@# Each line says only what was there to do.
	@if [ -f $(DEMO_DIR)/kubeconfig ]; then \
		rm -f $(DEMO_DIR)/kubeconfig; echo 'removed $(DEMO_DIR)/kubeconfig'; \
	fi
	@rm -f $(DEMO_DIR)/ca.crt $(DEMO_DIR)/tls.crt $(DEMO_DIR)/tls.key
	@if [ -f $(DEMO_DIR)/operator.log ]; then \
		echo 'kept $(DEMO_DIR)/operator.log and $(DEMO_DIR)/server.log (the next make demo keeps them as *.log.1)'; \
	fi

install: ## Install the CRD into the cluster of the current kubeconfig
	$(KUBECTL) apply -k config/crd

# Deleting the CRD deletes every object of the kind, and the garbage collector their pods.
uninstall: ## Say what goes, then remove the CRD, every ImmortalContainer and its pod (YES=1: no question)
	@set -e; $(CONFIRM) $(SAY_ICS) \
	if ! $(KUBECTL) get crd $(CRD) >/dev/null 2>&1; then echo 'the CRD is not installed'; exit 0; fi; \
	echo "make uninstall deletes, from the cluster of context '$$($(KUBECTL) config current-context 2>/dev/null)':"; \
	echo '  the CRD $(CRD), and with it'; say_ics; \
	confirm 'Delete all of this?'; \
	$(KUBECTL) delete -k config/crd --ignore-not-found

# An operator for a set of namespaces (--namespace a,b) with a Role and RoleBinding in each
# instead of the cluster-wide ClusterRole: make deploy IMG=... NAMESPACES=team-a,team-b (render,
# build-installer and undeploy take it too). The namespaces must exist before it is applied.
NAMESPACES ?=

# kustomize cannot take an absolute path as a resource, so the overlay reaches config/ through
# a symlink. IMG is split into the images: fields: a tag is the part after the last ':' of the
# last path segment (so registry:5000/x keeps its port), a digest the part after '@'. With
# NAMESPACES, the overlay is config/namespaced's: per namespace a directory giving
# config/rbac/namespaced that namespace, and the Deployment's --namespace.
render: ## Print the manifests deploy applies, with the image set to IMG (NAMESPACES=a,b: namespaced RBAC)
	@set -e; nss='$(NAMESPACES)'; \
	if [ -n "$$nss" ]; then \
		case ",$$nss," in *,,*) \
			echo "make render: NAMESPACES=$$nss has an empty entry (want NAMESPACES=a or a,b,...)" >&2; exit 1 ;; esac; \
		bad=$$(echo "$$nss" | tr , '\n' | grep -Evx '[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?' | head -n 1); \
		if [ -n "$$bad" ]; then \
			echo "make render: NAMESPACES: '$$bad' is not a namespace name (lowercase letters, digits and '-', at most 63)" >&2; exit 1; \
		fi; \
		twice=$$(echo "$$nss" | tr , '\n' | sort | uniq -d | head -n 1); \
		if [ -n "$$twice" ]; then echo "make render: NAMESPACES names '$$twice' twice" >&2; exit 1; fi; \
	fi; \
	dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	ln -s "$(CURDIR)/config" "$$dir/config"; \
	img='$(IMG)'; ref=$${img%%@*}; \
	case "$${ref##*/}" in *:*) name=$${ref%:*}; tag=$${ref##*:} ;; *) name=$$ref; tag=latest ;; esac; \
	case "$$img" in *@*) pin="digest: \"$${img#*@}\"" ;; *) pin="newTag: \"$$tag\"" ;; esac; \
	resources=config/default; \
	for ns in $$(echo "$$nss" | tr , ' '); do \
		mkdir "$$dir/ns-$$ns"; \
		printf '%s\n' "namespace: $$ns" 'resources: [../config/rbac/namespaced]' > "$$dir/ns-$$ns/kustomization.yaml"; \
		resources="$$resources, ns-$$ns"; \
	done; \
	{ printf '%s\n' "resources: [$$resources]" 'images:' '  - name: immortal-operator' \
		"    newName: $$name" "    $$pin"; \
	  [ -z "$$nss" ] || printf '%s\n' 'components: [config/namespaced]' 'patches:' \
		'  - target: {kind: Deployment, name: immortal-operator}' \
		"    patch: '[{\"op\": \"add\", \"path\": \"/spec/template/spec/containers/0/args/-\", \"value\": \"--namespace=$$nss\"}]'"; \
	} > "$$dir/kustomization.yaml"; \
	$(KUBECTL) kustomize "$$dir"

deploy: ## Deploy CRD, RBAC and the operator (image IMG; NAMESPACES=a,b: those only) to the current cluster
	@set -e; out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	$(MAKE) --no-print-directory -s render IMG='$(IMG)' NAMESPACES='$(NAMESPACES)' > "$$out"; \
	$(KUBECTL) apply -f "$$out"

# undeploy and uninstall delete what people made: each first says what will go, then goes on
# only when told, on a terminal ([y/N]) or with YES=1 (scripts, CI; without a terminal and
# without YES=1 nothing is deleted). kubebuilder's targets delete without a word.
YES ?=
CRD := immortalcontainers.immortalcontainer.flugel.it
# `confirm QUESTION`: returns once told to go on; a person's no ends the recipe with success,
# and no terminal to ask on (a script without YES=1) with failure, since what it asked for
# was not done.
CONFIRM = confirm() { \
	[ '$(YES)' != 1 ] || return 0; \
	if [ -t 0 ]; then \
		printf '%s [y/N] ' "$$1"; read -r answer || answer=; \
		case "$$answer" in [yY]|[yY][eE][sS]) return 0 ;; esac; \
		echo 'nothing deleted'; exit 0; \
	fi; \
	echo 'nothing deleted: no terminal to ask on; YES=1 deletes without asking' >&2; \
	exit 1; };
# `say_ics`: how many ImmortalContainers there are, and the first 20 of them.
SAY_ICS = say_ics() { \
	n=$$($(KUBECTL) get $(CRD) -A --no-headers 2>/dev/null | wc -l | tr -d ' '); \
	echo "  every ImmortalContainer in every namespace ($$n), and the pod of each"; \
	[ "$$n" -eq 0 ] || $(KUBECTL) get $(CRD) -A 2>/dev/null | head -n 21 | sed 's/^/    /'; \
	[ "$$n" -le 20 ] || echo "    ... and $$((n - 20)) more"; };
# The Role and RoleBinding a namespaced deploy (NAMESPACES=...) made in each served namespace,
# found by name and label, so that removing them needs no NAMESPACES.
SERVED_RBAC := roles,rolebindings -A -l app.kubernetes.io/name=immortal-operator \
	--field-selector metadata.name=immortal-operator
# `say_render FILE`: the objects of a render that exist, and the served namespaces' RBAC.
SAY_RENDER = say_render() { \
	$(KUBECTL) get -f "$$1" -o name --ignore-not-found | sed 's/^/    /' || true; \
	$(KUBECTL) get $(SERVED_RBAC) --no-headers \
		-o custom-columns='KIND:.kind,NS:.metadata.namespace,NAME:.metadata.name' 2>/dev/null | \
		awk '{ print "    " tolower($$1) "/" $$3 " in " $$2 }' || true; };

# `delete_served_rbac`: those Roles and RoleBindings, when there are any (a delete by selector
# that finds none says "No resources found", which is no news after an undeploy).
DELETE_SERVED_RBAC = delete_served_rbac() { \
	[ -z "$$($(KUBECTL) get $(SERVED_RBAC) -o name 2>/dev/null)" ] || \
		$(KUBECTL) delete $(SERVED_RBAC) --ignore-not-found; };

# In two steps, so that no pod or namespace is left stuck. First every ImmortalContainer, while
# the operator still runs: the garbage collector removes their pods, and the operator takes its
# counting finalizer off any pod that still holds it (a pod created a moment before, or while
# status could not be written). Then the rest. Deleting everything at once removes the operator,
# its RBAC and the CRD in the same moment, and a pod still holding the finalizer would then stay
# Terminating and keep its namespace from going. If the operator is not running (or the pods do
# not go within UNDEPLOY_TIMEOUT seconds), the finalizer, ours only, is taken off by hand.
UNDEPLOY_TIMEOUT ?= 120
COUNT_FINALIZER := immortalcontainer.flugel.it/count-start
MANAGED_PODS := -l app.kubernetes.io/managed-by=immortal-operator --all-namespaces
undeploy: ## Say what goes, then remove every ImmortalContainer and its pod, then all deploy made (YES=1: no question)
	@set -e; $(CONFIRM) $(SAY_ICS) $(SAY_RENDER) $(DELETE_SERVED_RBAC) \
	out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	$(MAKE) --no-print-directory -s render > "$$out"; \
	crd=; if $(KUBECTL) get crd $(CRD) >/dev/null 2>&1; then crd=1; fi; \
	echo "make undeploy deletes, from the cluster of context '$$($(KUBECTL) config current-context 2>/dev/null)':"; \
	[ -z "$$crd" ] || say_ics; \
	echo '  then the operator, its RBAC, the CRD and the namespace, as make deploy made them:'; \
	say_render "$$out"; \
	echo 'To remove only the operator and keep the CRD and every object: make undeploy-operator'; \
	confirm 'Delete all of this?'; \
	if [ -n "$$crd" ]; then \
		$(KUBECTL) delete $(CRD) --all --all-namespaces --wait=true; \
		echo "waiting up to $(UNDEPLOY_TIMEOUT)s for their pods to go"; \
		i=0; while [ -n "$$($(KUBECTL) get pods $(MANAGED_PODS) -o name)" ]; do \
			i=$$((i + 1)); \
			if [ $$i -gt $(UNDEPLOY_TIMEOUT) ]; then \
				echo "pods still there after $(UNDEPLOY_TIMEOUT)s; taking $(COUNT_FINALIZER) off them"; \
				$(KUBECTL) get pods $(MANAGED_PODS) \
					-o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.name}{"\n"}{end}' | \
				while read -r ns pod; do \
					$(KUBECTL) patch pod -n "$$ns" "$$pod" --type=strategic \
						-p '{"metadata":{"$$deleteFromPrimitiveList/finalizers":["$(COUNT_FINALIZER)"]}}' || true; \
				done; \
				break; \
			fi; \
			sleep 1; \
		done; \
	fi; \
	$(KUBECTL) delete -f "$$out" --ignore-not-found; \
	delete_served_rbac

# The operator only: its namespace (Deployment, ServiceAccount, Lease), its ClusterRoles and
# bindings and the served namespaces' Roles; the CRD, the roles that let people use the kind
# (immortalcontainer-editor, -viewer), every object and its pod stay. Nothing replaces an ended
# pod until an operator runs again. A document of the render is dropped when it is the CRD or
# one of those roles (kustomize writes kind and metadata.name at these indents).
KEEP_KIND := awk 'function flush() { if (doc != "" && !keep) printf "%s---\n", doc; doc = ""; keep = 0 } \
	/^---$$/ { flush(); next } /^kind: CustomResourceDefinition$$/ { keep = 1 } \
	/^  name: immortalcontainer-(editor|viewer)$$/ { keep = 1 } { doc = doc $$0 "\n" } END { flush() }'
undeploy-operator: ## Say what goes, then remove only the operator and its RBAC; the CRD, every object and pod stay (YES=1: no question)
	@set -e; $(CONFIRM) $(SAY_RENDER) $(DELETE_SERVED_RBAC) out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	$(MAKE) --no-print-directory -s render | $(KEEP_KIND) > "$$out"; \
	echo "make undeploy-operator deletes, from the cluster of context '$$($(KUBECTL) config current-context 2>/dev/null)':"; \
	say_render "$$out"; \
	echo 'and keeps the CRD, every ImmortalContainer and its pod (no ended pod is replaced until an operator runs)'; \
	confirm 'Delete all of this?'; \
	$(KUBECTL) delete -f "$$out" --ignore-not-found; \
	delete_served_rbac

# The one-file install (kubebuilder's convention): exactly what deploy applies, image IMG
# included, for `kubectl apply -f dist/install.yaml` on a machine without this repository.
# Rendered to a temporary file and renamed, so a failed render leaves no truncated installer.
# dist/ is not committed: the file names one image, and this repository publishes none.
# An installer names one image for good, so a tag that moves (latest, or none, which kustomize
# makes latest) is refused unless ALLOW_LATEST=1 says it is meant: without IMG it would silently
# name immortal-operator:latest, an image no registry holds.
ALLOW_LATEST ?=
build-installer: ## Write dist/install.yaml (CRD, RBAC, Deployment of image IMG; NAMESPACES=a,b) for kubectl apply -f
	@img='$(IMG)'; ref=$${img%%@*}; \
	case "$$img" in *@*) tag=pinned ;; *) case "$${ref##*/}" in *:*) tag=$${ref##*:} ;; *) tag= ;; esac ;; esac; \
	if [ "$$tag" = latest ] || [ -z "$$tag" ]; then \
		if [ '$(ALLOW_LATEST)' != 1 ]; then \
			echo "make build-installer: IMG=$$img has no fixed tag, and an installer should name the image it was built for;" \
				'give one (make build-installer IMG=registry.example.com/immortal-operator:v0.1.0), or ALLOW_LATEST=1 to write it anyway' >&2; \
			exit 1; \
		fi; \
	fi
	@set -e; mkdir -p dist; tmp=$$(mktemp dist/.install.yaml.XXXXXX); trap 'rm -f "$$tmp"' EXIT; \
	$(MAKE) --no-print-directory -s render IMG='$(IMG)' NAMESPACES='$(NAMESPACES)' > "$$tmp"; \
	chmod 644 "$$tmp"; mv "$$tmp" dist/install.yaml; \
	img=$$(sed -n 's/^[ -]*image: *\([^ ].*\)$$/\1/p' dist/install.yaml | head -n 1); \
	echo "wrote dist/install.yaml with image $${img:-(none: the render named no image)}$(if $(NAMESPACES),$(comma) serving $(NAMESPACES) with a Role in each (create them first))"

docker-build: ## Build the operator image IMG
	$(CONTAINER_TOOL) build -t $(IMG) .

# Local clusters without a registry: the image built here is loaded into the cluster's nodes,
# where the Deployment's imagePullPolicy IfNotPresent finds it. LOCAL_CLUSTER is kind, k3d or
# minikube; LOCAL_CLUSTER_NAME the cluster (kind, k3d) or profile (minikube), empty for the
# tool's default (kind, k3s-default, minikube). Each tool takes the image from the local Docker.
LOCAL_CLUSTER ?= kind
LOCAL_CLUSTER_NAME ?=
KIND ?= kind
K3D ?= k3d
MINIKUBE ?= minikube
load-image: ## Load the image IMG built here into a local cluster (LOCAL_CLUSTER=kind, k3d or minikube)
	@name='$(LOCAL_CLUSTER_NAME)'; case '$(LOCAL_CLUSTER)' in \
	kind) cmd="$(KIND) load docker-image $(IMG)$${name:+ --name $$name}" ;; \
	k3d) cmd="$(K3D) image import $(IMG)$${name:+ --cluster $$name}" ;; \
	minikube) cmd="$(MINIKUBE) image load $(IMG)$${name:+ --profile $$name}" ;; \
	*) echo "make load-image: LOCAL_CLUSTER=$(LOCAL_CLUSTER) is none of kind, k3d, minikube" >&2; exit 1 ;; \
	esac; echo "$$cmd"; $$cmd

# Built, loaded and deployed; then restarted, since a tag loaded again (immortal-operator:latest
# after a rebuild) changes nothing in the Deployment, so without it the pods would keep running
# the image they started with.
deploy-local: ## Build IMG, load it into a local cluster (LOCAL_CLUSTER=kind, k3d, minikube) and deploy it
	$(MAKE) --no-print-directory docker-build IMG='$(IMG)'
	$(MAKE) --no-print-directory load-image IMG='$(IMG)'
	$(MAKE) --no-print-directory deploy IMG='$(IMG)' NAMESPACES='$(NAMESPACES)'
	$(KUBECTL) rollout restart deployment/immortal-operator -n immortalcontainers-operator

# The image for every platform in PLATFORMS, pushed to IMG as one multi-platform image (buildx
# cannot load a multi-platform image into Docker's classic image store, so it pushes, as
# kubebuilder's docker-buildx does). The Dockerfile builds each platform natively: a builder
# with a node of each architecture builds at full speed; a single amd64 node builds arm64 under
# QEMU (binfmt handlers must be installed), several times slower. The builder is
# created once and kept, so its cache mounts (registry, target dirs) serve the next build.
PLATFORMS ?= linux/amd64,linux/arm64
BUILDX_BUILDER ?= immortal-operator-builder
docker-buildx: ## Build and push the image IMG for PLATFORMS (linux/amd64,linux/arm64)
	$(CONTAINER_TOOL) buildx inspect $(BUILDX_BUILDER) >/dev/null 2>&1 || \
		$(CONTAINER_TOOL) buildx create --name $(BUILDX_BUILDER) --driver docker-container
	$(CONTAINER_TOOL) buildx build --builder $(BUILDX_BUILDER) --platform $(PLATFORMS) \
		--tag $(IMG) --push .

# The bench measures the binary the image ships, the static musl build, when this machine can
# build it; otherwise the glibc build, and says so (its idle RSS is 1.5 MiB higher). The operator
# is built first so the bench measures the current code. Results also go to bench-results.json.
bench: ## Benchmark the operator (BENCH_ARGS="--objects 10000" or "--kubeconfig PATH")
	@if rustup target list --installed 2>/dev/null | grep -qx '$(MUSL_TARGET)' \
		&& command -v musl-gcc >/dev/null 2>&1; then \
		op='$(TARGET_DIR)/$(MUSL_TARGET)/release/immortal-operator'; \
		$(CARGO) build --release --target $(MUSL_TARGET) -p immortal-operator || exit 1; \
	else \
		echo 'make bench: no $(MUSL_TARGET) target or musl-gcc; measuring the glibc build, not the shipped static one'; \
		op='$(TARGET_DIR)/release/immortal-operator'; \
		$(CARGO) build --release -p immortal-operator || exit 1; \
	fi; \
	$(CARGO) run --release -p immortal-bench -- --operator "$$op" $(BENCH_ARGS)

# 100,000 objects: a benchmark, never a test. The herd phase queues another 100,000, so the run
# creates about 400,000 objects in the test server (which holds them in the bench's memory).
bench-large: ## Benchmark 100,000 objects (about 20 minutes on 2 cores; results in bench-results-100k.json)
	$(MAKE) bench BENCH_ARGS="--objects 100000 --timeout 7200 --json bench-results-100k.json $(BENCH_ARGS)"

# The CRD's spec.template schema is generated from Kubernetes 1.37's PodTemplateSpec
# (tests/fixtures/openapi-1.37/); the same test fails when the CRD drifts from it.
generate: ## Regenerate the spec.template schema in config/crd/immortalcontainers.yaml
	IMMORTAL_REGENERATE_CRD=1 $(CARGO) test -p immortal-operator --test crd_schema

fmt: ## Format all code
	$(CARGO) fmt --all

lint: ## Check formatting and run clippy with warnings as errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Issue 24's measure of the operator's size: every line in src/ (comments and blank lines too)
# but the code only tests compile, #[cfg(test)] modules inline or in files of their own.
lines: ## Count the operator's non-test lines in src/ (per file with V=1)
	@files=$$(find src -name '*.rs' | sort); \
	tests=$$(awk '/^ *#\[cfg\(test\)\]/ { t = 1; next } \
	  t && /^ *(pub(\(crate\))? )?mod [a-z_0-9]+;/ { \
	    m = $$0; sub(/.*mod /, "", m); sub(/;.*/, "", m); d = FILENAME; sub(/\.rs$$/, "", d); \
	    if (d ~ /\/(mod|lib|main)$$/) sub(/\/[a-z]+$$/, "", d); print d "/" m ".rs" } { t = 0 }' $$files); \
	for f in $$files; do case " $$(echo $$tests) " in *" $$f "*) continue;; esac; echo $$f; done | \
	xargs awk -v v="$(V)" 'FNR == 1 { if (n) { total += n; if (v) print n, prev }; n = 0; skip = 0; prev = FILENAME } \
	  skip { if ($$0 ~ "^" ind "}") skip = 0; next } \
	  t && /^ *(pub(\(crate\))? )?mod [a-z_0-9]+ *\{/ { ind = $$0; sub(/[^ ].*/, "", ind); skip = 1; t = 0; n--; next } \
	  t && /^ *(pub(\(crate\))? )?mod [a-z_0-9]+;/ { t = 0; n--; next } \
	  { t = ($$0 ~ /^ *#\[cfg\(test\)\]$$/); n++ } \
	  END { total += n; if (v) print n, prev; print total, "non-test lines in src/" }'
