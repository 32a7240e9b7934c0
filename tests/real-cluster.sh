#!/usr/bin/env bash
# The real-cluster tier of `make test`: a Kubernetes control plane with one node, on loopback,
# from the binaries in $KUBE_ASSETS (as envtest takes KUBEBUILDER_ASSETS), and on it the CRD,
# the RBAC, the installer, make deploy / undeploy and the end-to-end suite (docs/testing.md).
#
# usage: tests/real-cluster.sh start|stop|tier|snapshot FILE|restore FILE
#   start  starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a kubemark
#          hollow node (the real kubelet over a fake container runtime) and prints the admin
#          kubeconfig once the node is Ready; the API server keeps an audit log of every pod,
#          ImmortalContainer status and Lease write in $REAL_KUBE_DIR/audit.log
#   stop   ends the processes start began (by their pid files), nothing else
#   tier   start, then the checks, then stop whatever the outcome (the state directory, with
#          every component's log, is kept when something failed, and named)
#   snapshot FILE  saves etcd's data to FILE (etcdctl snapshot save)
#   restore FILE   etcd restored from FILE as etcd 3.4 does it (no --bump-revision): every
#          component stopped, etcd restored into a fresh data directory and started on it, then
#          the API server, the controllers and the node, as Kubernetes' own procedure asks;
#          anything else using the API server (an operator) goes on as it is
# Environment:
#   KUBE_ASSETS      kube-apiserver, kube-controller-manager, kube-scheduler, kubemark (a build
#                    with --kubelet-root-dir, --kubelet-address and --feature-gates); etcd on PATH
#   REAL_KUBE_DIR    state: certificates, kubeconfigs, pid files, logs, and audit.log, the API
#                    server's record of every pod create, which the end-to-end suite counts
#                    pods against (default ${TMPDIR:-/tmp}/immortal-real-kube)
#   REAL_KUBE_PORT   kube-apiserver (16443); etcd 16379 and 16380, controller-manager 16257,
#                    scheduler 16259, kubelet 16250: REAL_KUBE_{ETCD,KCM,SCHED,KUBELET}_PORT
#   REAL_KUBE_FEATURE_GATES  for every component (SidecarContainers=true: native sidecars,
#                    alpha and off in 1.28, on by default from 1.29)
#   E2E_TESTS, CARGO, KUBECTL  what tier runs (the Makefile passes them)
set -euo pipefail
cd "$(dirname "$0")/.."

ASSETS=${KUBE_ASSETS:-}
DIR=${REAL_KUBE_DIR:-${TMPDIR:-/tmp}/immortal-real-kube}
PORT=${REAL_KUBE_PORT:-16443}
ETCD_PORT=${REAL_KUBE_ETCD_PORT:-16379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
KCM_PORT=${REAL_KUBE_KCM_PORT:-16257}
SCHED_PORT=${REAL_KUBE_SCHED_PORT:-16259}
KUBELET_PORT=${REAL_KUBE_KUBELET_PORT:-16250}
GATES=${REAL_KUBE_FEATURE_GATES-SidecarContainers=true}
NODE=hollow-node-0
KUBECTL=${KUBECTL:-kubectl}
CARGO=${CARGO:-cargo}
E2E_TESTS=${E2E_TESTS:-e2e endings day2 production leader template network watch_stall}
BINARIES="kube-apiserver kube-controller-manager kube-scheduler kubemark"
# Stopped in this order: the node and the controllers before the API server, etcd last.
COMPONENTS="kubelet scheduler kcm apiserver etcd"

launched=
die() { echo "real-cluster: $*" >&2; exit 1; }
kc() { "$KUBECTL" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }

# A pid file counts while its process lives and runs in $DIR (each one is started there), so a
# pid reused by another process is never signalled.
alive() {
  local pid
  [ -f "$DIR/$1.pid" ] || return 1
  pid=$(cat "$DIR/$1.pid")
  kill -0 "$pid" 2>/dev/null && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$(readlink -f "$DIR")" ]
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# `wait_for WHAT SECONDS COMMAND...`: until the command succeeds, at most that long, and not
# past the end of any component started.
wait_for() {
  local what=$1 limit=$2 end=$((SECONDS + $2)) p; shift 2
  until "$@" >/dev/null 2>&1; do
    for p in $COMPONENTS; do
      if [ -f "$DIR/$p.pid" ] && ! alive "$p"; then
        die "$p exited while waiting for $what; the end of $DIR/$p.log: $(tail -n 3 "$DIR/$p.log" | tr '\n' ' ')"
      fi
    done
    [ $SECONDS -lt $end ] || die "$what not ready after $limit s; logs in $DIR"
    sleep 0.2
  done
}

# SIGTERM, then SIGKILL after 5 s (the API server drains watches for up to a minute).
end_proc() {
  local pid end
  if ! alive "$1"; then rm -f "$DIR/$1.pid"; return 0; fi
  pid=$(cat "$DIR/$1.pid"); end=$((SECONDS + 5))
  kill "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$DIR/$1.pid"
}

stop() {
  local p
  [ -d "$DIR" ] || return 0
  for p in $COMPONENTS; do end_proc "$p"; done
  rm -rf "$DIR/etcd" "$DIR/kubelet"
}

# Everything start needs, each missing piece said in one line before anything runs.
preflight() {
  local b missing=
  [ -n "$ASSETS" ] || die "KUBE_ASSETS names no directory (want one holding $BINARIES)"
  [ -d "$ASSETS" ] || die "KUBE_ASSETS=$ASSETS is no directory"
  for b in $BINARIES; do [ -x "$ASSETS/$b" ] || missing="$missing $b"; done
  [ -z "$missing" ] || die "KUBE_ASSETS=$ASSETS lacks:$missing"
  command -v etcd >/dev/null || die "etcd is not on PATH (Debian: apt-get install etcd-server)"
  command -v openssl >/dev/null || die "openssl is not on PATH (for the cluster's certificates)"
  command -v "$KUBECTL" >/dev/null || die "$KUBECTL is not on PATH"
}

free_ports() {
  local port
  for port in $PORT $ETCD_PORT $ETCD_PEER_PORT $KCM_PORT $SCHED_PORT $KUBELET_PORT; do
    if listening "$port"; then
      die "port $port on 127.0.0.1 is in use (set REAL_KUBE_PORT and the other REAL_KUBE_*_PORT)"
    fi
  done
}

certificates() {
  mkdir -p "$DIR/pki"
  (
    cd "$DIR/pki"
    [ -f ca.crt ] && exit 0
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj /CN=real-cluster-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,IP:10.0.0.1\n' > ext.cnf
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 30 -extfile ext.cnf 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  # Static tokens: an admin, and the node's own identity (Node authorizer, NodeRestriction).
  printf 'admin-token,admin,1,system:masters\nnode-token,system:node:%s,2,system:nodes\n' "$NODE" > "$DIR/pki/tokens.csv"
  local who
  for who in admin node; do
    cat > "$DIR/$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: real-cluster
  cluster:
    server: https://127.0.0.1:$PORT
    certificate-authority: $DIR/pki/ca.crt
users:
- name: $who
  user:
    token: $who-token
contexts:
- name: $who
  context: {cluster: real-cluster, user: $who, namespace: default}
current-context: $who
EOF
  done
}

# `run NAME COMMAND...`: in the background, in $DIR, its output in NAME.log, its pid in NAME.pid.
run() {
  local name=$1; shift
  (cd "$DIR" && exec "$@" > "$DIR/$name.log" 2>&1) &
  echo $! > "$DIR/$name.pid"
}

# What the audit log keeps: the writes behind a count (pods, ImmortalContainer status) and
# leadership (Leases), so counts can be checked against what the API server accepted.
audit_policy() {
  cat > "$DIR/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  resources: [{group: "", resources: ["pods", "pods/status", "pods/eviction"]}]
  verbs: ["create", "update", "patch", "delete"]
- level: Metadata
  resources: [{group: "immortalcontainer.flugel.it", resources: ["immortalcontainers/status"]}]
  verbs: ["update", "patch"]
- level: Metadata
  resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
  verbs: ["create", "update", "patch", "delete"]
- level: None
EOF
}

start_etcd() {
  run etcd etcd --name real-cluster --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "real-cluster=http://127.0.0.1:$ETCD_PEER_PORT"
  wait_for etcd 20 listening "$ETCD_PORT"
}

start_apiserver() {
  run apiserver "$ASSETS/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$PORT" \
    --tls-cert-file pki/apiserver.crt --tls-private-key-file pki/apiserver.key \
    --client-ca-file pki/ca.crt --token-auth-file pki/tokens.csv \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file pki/sa.pub \
    --service-account-signing-key-file pki/sa.key --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --allow-privileged=true \
    --endpoint-reconciler-type none --enable-priority-and-fairness=false \
    --feature-gates "ValidatingAdmissionPolicy=true${GATES:+,$GATES}" \
    --runtime-config admissionregistration.k8s.io/v1beta1=true \
    --audit-policy-file audit-policy.yaml --audit-log-path audit.log --audit-log-maxsize 500
  wait_for kube-apiserver 60 kc get --raw /readyz
}

start() {
  preflight
  stop
  free_ports
  launched=1
  mkdir -p "$DIR"
  certificates
  audit_policy
  rm -f "$DIR/audit.log"
  start_etcd
  start_apiserver
  start_rest
  echo "real-cluster: $("$ASSETS/kube-apiserver" --version) up: KUBECONFIG=$DIR/admin.kubeconfig"
}

# The controllers and the node, once the API server answers.
start_rest() {
  local gates=${GATES:+--feature-gates=$GATES}
  run kcm "$ASSETS/kube-controller-manager" --kubeconfig admin.kubeconfig \
    --authentication-kubeconfig admin.kubeconfig --authorization-kubeconfig admin.kubeconfig \
    --service-account-private-key-file pki/sa.key --root-ca-file pki/ca.crt \
    --cluster-signing-cert-file pki/ca.crt --cluster-signing-key-file pki/ca.key \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port "$KCM_PORT" $gates
  run scheduler "$ASSETS/kube-scheduler" --kubeconfig admin.kubeconfig \
    --authentication-kubeconfig admin.kubeconfig --authorization-kubeconfig admin.kubeconfig \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" $gates
  mkdir -p "$DIR/kubelet"
  run kubelet "$ASSETS/kubemark" --morph=kubelet --name="$NODE" --kubeconfig node.kubeconfig \
    --kubelet-root-dir "$DIR/kubelet" --kubelet-make-iptables-util-chains=false \
    --kubelet-address 127.0.0.1 --kubelet-port "$KUBELET_PORT" --kubelet-read-only-port 0 \
    --use-host-image-service=false --max-pods 2500 $gates
  # The default ServiceAccount appears once the controller-manager runs.
  wait_for "the default ServiceAccount" 60 kc -n default get serviceaccount default
  wait_for "node $NODE" 60 kc wait --for=condition=Ready "node/$NODE" --timeout=1s
}

snapshot() {
  [ -n "${1:-}" ] || die "snapshot: name the file to save to"
  alive etcd || die "snapshot: etcd is not running (start first)"
  ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$ETCD_PORT" snapshot save "$1" >/dev/null \
    || die "snapshot: etcdctl snapshot save $1 failed"
  echo "real-cluster: etcd saved to $1"
}

# A new data directory (a new cluster ID) holding the snapshot's revision: every
# resourceVersion the API server answers from then on is lower than those it answered before.
restore() {
  local file=${1:-} p
  [ -f "$file" ] || die "restore: no snapshot file ${file:-named}"
  alive apiserver || die "restore: the cluster is not running (start first)"
  for p in kubelet scheduler kcm apiserver etcd; do end_proc "$p"; done
  rm -rf "$DIR/etcd" "$DIR/kubelet"
  ETCDCTL_API=3 etcdctl snapshot restore "$file" --data-dir "$DIR/etcd" --name real-cluster \
    --initial-cluster "real-cluster=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" >"$DIR/restore.log" 2>&1 \
    || die "restore: etcdctl snapshot restore $file failed: $(tail -n 1 "$DIR/restore.log")"
  start_etcd
  start_apiserver
  start_rest
  echo "real-cluster: etcd restored from $file; the API server, the controllers and the node restarted on it"
}

# `step WHAT COMMAND...`: runs it, saying what it was when it fails.
step() {
  local what=$1; shift
  echo "real-cluster: $what"
  "$@" || { echo "real-cluster: FAILED: $what" >&2; return 1; }
}

# The end of tier, whatever its outcome: the cluster stopped, its state removed only if all
# passed.
finish() {
  local status=$?
  stop
  if [ $status -eq 0 ]; then
    rm -rf "$DIR"
  elif [ -n "$launched" ]; then
    echo "real-cluster: failed; the control plane's logs are in $DIR" >&2
  fi
  exit $status
}

tier() {
  local began=$SECONDS out tests= t
  trap finish EXIT
  trap 'exit 130' INT TERM
  start
  export KUBECONFIG=$DIR/admin.kubeconfig
  out=$DIR/install.yaml
  step "the CRD applies client-side" kc apply -k config/crd
  step "the CRD applies server-side" kc apply --server-side --force-conflicts -k config/crd
  step "the RBAC applies" sh -c "$KUBECTL apply -f config/manager/namespace.yaml && $KUBECTL apply -k config/rbac"
  step "the one-file installer renders" sh -c "make --no-print-directory -s render IMG=immortal-operator:v0.0.0-real-tier > '$out'"
  step "the one-file installer applies" kc apply -f "$out"
  step "make deploy" make --no-print-directory deploy IMG=immortal-operator:v0.0.0-real-tier
  step "the operator's Deployment rolls out" kc -n immortalcontainers-operator rollout status deployment/immortal-operator --timeout=120s
  step "make undeploy" make --no-print-directory undeploy YES=1
  step "the operator's namespace is gone" kc wait --for=delete namespace/immortalcontainers-operator --timeout=120s
  for t in $E2E_TESTS; do tests="$tests --test $t"; done
  export IMMORTAL_E2E_KUBECONFIG=$KUBECONFIG IMMORTAL_E2E_SKIPS=$DIR/skipped
  export IMMORTAL_E2E_AUDIT_LOG=$DIR/audit.log
  : > "$IMMORTAL_E2E_SKIPS"
  if "$CARGO" nextest --version >/dev/null 2>&1; then
    step "the end-to-end suite" "$CARGO" nextest run -p immortal-operator $tests --no-fail-fast -j 4
  else
    step "the end-to-end suite" "$CARGO" test -p immortal-operator $tests -- --test-threads 4
  fi
  echo "real-cluster: $(wc -l < "$IMMORTAL_E2E_SKIPS") scenarios said SKIPPED here:"
  sort "$IMMORTAL_E2E_SKIPS" | sed 's/^/  /'
  echo "real-cluster: passed in $((SECONDS - began)) s"
}

case ${1:-} in
  start) start;;
  stop) stop;;
  tier) tier;;
  snapshot) snapshot "${2:-}";;
  restore) restore "${2:-}";;
  *) echo "usage: $0 start|stop|tier|snapshot FILE|restore FILE" >&2; exit 2;;
esac
