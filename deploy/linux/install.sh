#!/bin/sh
# Install or upgrade the Scheduled Events bridge (agent + optional approver) on a systemd Linux VM, or,
# with --role central, a fleet's central services (fleet approver, Azure's channel; no agent) on a VM
# of their own (infra/modules/central.bicep, issue 34).
#
# Why a POSIX sh script: the Azure Custom Script extension runs its protected `script` with /bin/sh
# (dash on Debian/Ubuntu), and cloud-init runs it the same way, so it must not need bash.
#
# What it does, idempotently (a second run upgrades in place):
#   1. finds a Python >= 3.11 (installs python3.11 + venv from the distribution when none is there);
#   2. creates the service user `se-bridge` (system account, no login shell, no home);
#   3. creates or reuses the virtual environment /opt/se-bridge/venv and installs the package into it
#      (from a wheel file or URL, or from the configured package index);
#   4. writes secrets (HMAC key files, environment variables) with mode 0600, never on the command line;
#   5. renders /etc/se-bridge/config.toml (mode 0600) from the settings, unless it exists and
#      --force-config was not given (a hand-edited config is never clobbered by accident), after
#      validating it with the installed package's own configuration table;
#   6. installs hardened systemd units for the agent and the approver, enables and (re)starts them,
#      and waits until every enabled service answers /healthz (python -m bridge.commands.install_health).
# The state directories (/var/lib/se-bridge, /var/lib/se-bridge-approver) are created when missing
# and never removed: the outbox and the baseline document survive upgrades.
#
# SE_BRIDGE_ROOT=/some/dir installs everything under that prefix instead of / (for tests and image
# builds): no user is created, nothing is chowned, systemctl is not called, and the paths inside the
# rendered config and units point under the prefix.
#
# Secrets never go on the command line (the process list is readable by every local user): pass them
# as a JSON file with --secrets FILE or base64-encoded in SE_BRIDGE_INSTALL_SECRETS_B64:
#   {"files": {"webhook.key": "...", "keys/ops-2026.key": "..."},  -> /etc/se-bridge/<name>, 0600
#    "env":   {"EVENTHUBS_CONNECTION_STRING": "..."},              -> /etc/se-bridge/environment, 0600
#    "approverKeys": {"ops-2026": "..."},                          -> keys/<id>.key + approver `key`
#    "pipIndexUrl": "<a private index URL, credentials included>"}  -> pip --index-url
set -eu

PROG=se-bridge-install
ROOT=${SE_BRIDGE_ROOT:-}
ROOT=${ROOT%/}

usage() {
    cat <<'EOF'
Usage: install.sh [options]

Package (default: scheduled-events-bridge from the configured index, extras "eventhubs,keyvault"):
  --wheel FILE|URL          install this wheel (a local file, or an https URL downloaded first)
  --download-identity ID    fetch an https --wheel (a blob) with the VM's managed identity of this
                            client id (Entra ID token from IMDS; the storage account needs no key)
  --package REQUIREMENT     pip requirement to install when no wheel is given
  --extras LIST             extras to install, comma separated ("" for none; default: eventhubs,keyvault)
  --index-url URL           pip index URL (use the secrets file when it holds credentials)
  --find-links DIR          extra directory of wheels for pip (repeatable)
  --no-index                do not use any index (everything from --find-links / the wheel)
  --python PATH             interpreter for the virtual environment (default: newest python3 >= 3.11)

Configuration (rendered into /etc/se-bridge/config.toml):
  --settings FILE           JSON {"agent": {...}, "approver": {...}}: keys are the TOML keys
                            (the flag names with '_'), e.g. {"agent": {"sink": ["stdout:"]}}
  --settings-b64 B64        the same JSON, base64-encoded (env SE_BRIDGE_INSTALL_SETTINGS_B64)
  --sink SPEC               agent sink (repeatable; replaces the sinks of --settings)
  --poll-interval SECONDS   agent poll interval
  --approver-source SPEC    enable the approver, reading decisions from SPEC
  --approver-relay URL      relay URL (default: the local agent, http://127.0.0.1:8710)
  --approver-mode MODE      local (default) or fleet
  --approver-key KEYID=PATH approver HMAC key file (repeatable)
  --approver-sink SPEC      where the approver publishes audit records (repeatable)
  --secrets FILE            JSON file of secrets (see the top of this script); deleted by nobody
  --force-config            re-render config.toml even when it exists (the old one is kept as
                            config.toml.previous)
  --role ROLE               agent (default: the agent, and an approver when configured) or central
                            (no agent: the fleet approver and Azure's channel of the settings'
                            "approver" and "azure_channel" tables, each with its own sinks)

Service:
  --user NAME               service account (default: se-bridge)
  --no-start                install and enable nothing; just lay the files down
  -h, --help                this help

Environment: SE_BRIDGE_ROOT (install prefix, default /), SE_BRIDGE_INSTALL_SETTINGS_B64,
SE_BRIDGE_INSTALL_SECRETS_B64.
EOF
}

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Newline-separated lists (POSIX sh has no arrays); a spec never contains a newline.
NL='
'
WHEEL= DOWNLOAD_IDENTITY= PACKAGE=scheduled-events-bridge EXTRAS=eventhubs,keyvault INDEX_URL= NO_INDEX= FIND_LINKS= PYTHON=
SETTINGS_FILE= SETTINGS_B64=${SE_BRIDGE_INSTALL_SETTINGS_B64:-} SECRETS_FILE=
SINKS= POLL_INTERVAL= APPROVER_SOURCE= APPROVER_RELAY= APPROVER_MODE= APPROVER_KEYS= APPROVER_SINKS=
FORCE_CONFIG=0 SVC_USER=se-bridge NO_START=0 ROLE=agent

need_arg() { [ "$#" -ge 2 ] || die "$1 needs a value"; }
while [ "$#" -gt 0 ]; do
    case "$1" in
        --wheel) need_arg "$@"; WHEEL=$2; shift 2 ;;
        --download-identity) need_arg "$@"; DOWNLOAD_IDENTITY=$2; shift 2 ;;
        --package) need_arg "$@"; PACKAGE=$2; shift 2 ;;
        --extras) need_arg "$@"; EXTRAS=$2; shift 2 ;;
        --index-url) need_arg "$@"; INDEX_URL=$2; shift 2 ;;
        --find-links) need_arg "$@"; FIND_LINKS="$FIND_LINKS$2$NL"; shift 2 ;;
        --no-index) NO_INDEX=1; shift ;;
        --python) need_arg "$@"; PYTHON=$2; shift 2 ;;
        --settings) need_arg "$@"; SETTINGS_FILE=$2; shift 2 ;;
        --settings-b64) need_arg "$@"; SETTINGS_B64=$2; shift 2 ;;
        --sink) need_arg "$@"; SINKS="$SINKS$2$NL"; shift 2 ;;
        --poll-interval) need_arg "$@"; POLL_INTERVAL=$2; shift 2 ;;
        --approver-source) need_arg "$@"; APPROVER_SOURCE=$2; shift 2 ;;
        --approver-relay) need_arg "$@"; APPROVER_RELAY=$2; shift 2 ;;
        --approver-mode) need_arg "$@"; APPROVER_MODE=$2; shift 2 ;;
        --approver-key) need_arg "$@"; APPROVER_KEYS="$APPROVER_KEYS$2$NL"; shift 2 ;;
        --approver-sink) need_arg "$@"; APPROVER_SINKS="$APPROVER_SINKS$2$NL"; shift 2 ;;
        --secrets) need_arg "$@"; SECRETS_FILE=$2; shift 2 ;;
        --force-config) FORCE_CONFIG=1; shift ;;
        --role) need_arg "$@"; ROLE=$2; shift 2
            case "$ROLE" in agent|central) ;; *) die "--role: agent or central" ;; esac ;;
        --user) need_arg "$@"; SVC_USER=$2; shift 2 ;;
        --no-start) NO_START=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done

case "$SVC_USER" in
    '' | *[!a-z0-9_-]*) die "--user must be a lower-case account name" ;;
esac

ETC=$ROOT/etc/se-bridge
OPT=$ROOT/opt/se-bridge
VENV=$OPT/venv
STATE=$ROOT/var/lib/se-bridge
APPROVER_STATE=$ROOT/var/lib/se-bridge-approver
AZURE_STATE=$ROOT/var/lib/se-bridge-azure
LOGS=$ROOT/var/log/se-bridge
UNITS=$ROOT/etc/systemd/system
# Only a real install (no prefix, as root) creates the account, chowns and talks to systemd.
REAL=0
if [ -z "$ROOT" ] && [ "$(id -u)" = 0 ]; then REAL=1; fi
if [ -z "$ROOT" ] && [ "$REAL" = 0 ]; then
    die "run as root (or set SE_BRIDGE_ROOT to install under a prefix)"
fi

# -- 1. Python >= 3.11 -------------------------------------------------------------------------------
py_ok() { "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
find_python() {
    if [ -n "$PYTHON" ]; then
        py_ok "$PYTHON" || die "--python $PYTHON is not a Python >= 3.11 with the venv module"
        return
    fi
    for cand in python3.13 python3.12 python3.11 python3; do
        if command -v "$cand" >/dev/null 2>&1 && py_ok "$cand"; then
            PYTHON=$(command -v "$cand")
            return
        fi
    done
    PYTHON=
}
find_python
if [ -z "$PYTHON" ] && [ "$REAL" = 1 ]; then
    log "no Python >= 3.11 found; installing python3.11 from the distribution"
    if command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3.11 python3.11-venv >&2
    elif command -v dnf >/dev/null 2>&1; then
        dnf install -y -q python3.11 python3.11-pip >&2
    elif command -v tdnf >/dev/null 2>&1; then
        tdnf install -y -q python3 python3-pip >&2
    fi
    find_python
fi
[ -n "$PYTHON" ] || die "no Python >= 3.11 found (install one, or pass --python PATH)"
# Debian and Ubuntu ship ensurepip separately (python3.X-venv); without it `python -m venv` fails.
if ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
    PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$REAL" = 1 ] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "python$PYVER-venv" >&2
    else
        die "$PYTHON has no ensurepip (install python$PYVER-venv)"
    fi
fi

# -- 2. service account ----------------------------------------------------------------------------
if [ "$REAL" = 1 ] && ! getent passwd "$SVC_USER" >/dev/null 2>&1; then
    NOLOGIN=$(command -v nologin 2>/dev/null || echo /bin/false)
    useradd --system --user-group --no-create-home --home-dir /var/lib/se-bridge \
        --shell "$NOLOGIN" --comment "Scheduled Events bridge" "$SVC_USER"
    log "created system user $SVC_USER"
fi

umask 022
mkdir -p "$OPT" "$ETC" "$UNITS" "$LOGS"
chmod 0750 "$ETC"
for dir in "$STATE" "$APPROVER_STATE" "$AZURE_STATE"; do
    if [ ! -d "$dir" ]; then mkdir -p "$dir"; fi
    chmod 0700 "$dir"
done
if [ "$REAL" = 1 ]; then
    chown root:"$SVC_USER" "$ETC"
    chown "$SVC_USER:$SVC_USER" "$STATE" "$APPROVER_STATE" "$AZURE_STATE" "$LOGS"
fi

# -- 3. virtual environment and package --------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/se-bridge-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM

# Secrets: decode to a private file once; every later step reads that file, never argv.
SECRETS_JSON=$WORK/secrets.json
(
    umask 077
    if [ -n "$SECRETS_FILE" ]; then
        cat "$SECRETS_FILE" >"$SECRETS_JSON"
    elif [ -n "${SE_BRIDGE_INSTALL_SECRETS_B64:-}" ]; then
        printf '%s' "$SE_BRIDGE_INSTALL_SECRETS_B64" | "$PYTHON" -c \
            'import base64, sys; sys.stdout.buffer.write(base64.b64decode(sys.stdin.buffer.read()))' \
            >"$SECRETS_JSON"
    else
        printf '{}' >"$SECRETS_JSON"
    fi
)
unset SE_BRIDGE_INSTALL_SECRETS_B64  # not inherited by pip or the services
secret_field() {
    "$PYTHON" -c 'import json, sys; v = json.load(open(sys.argv[1])).get(sys.argv[2]) or ""; print(v)' \
        "$SECRETS_JSON" "$1"
}

venv_ok() {
    [ -x "$VENV/bin/python" ] || return 1
    want=$("$PYTHON" -c 'import sys; print(sys.version_info[:2])')
    have=$("$VENV/bin/python" -c 'import sys; print(sys.version_info[:2])' 2>/dev/null) || return 1
    [ "$want" = "$have" ]
}
if venv_ok; then
    log "reusing $VENV"
else
    log "creating $VENV with $PYTHON"
    "$PYTHON" -m venv --clear "$VENV"
fi

# pip options, kept in a file of one argument per line so URLs with '&' or spaces survive sh.
PIP_ARGS=$WORK/pip-args
: >"$PIP_ARGS"
[ -n "$NO_INDEX" ] && echo "--no-index" >>"$PIP_ARGS"
printf '%s' "$FIND_LINKS" | while IFS= read -r dir; do
    [ -n "$dir" ] && printf -- '--find-links\n%s\n' "$dir" >>"$PIP_ARGS"
done
[ -z "$INDEX_URL" ] && INDEX_URL=$(secret_field pipIndexUrl)
[ -n "$INDEX_URL" ] && printf -- '--index-url\n%s\n' "$INDEX_URL" >>"$PIP_ARGS"

if [ -n "$WHEEL" ]; then
    case "$WHEEL" in
        https://*)
            # Downloaded here rather than by pip so that a SAS token in the URL never reaches a log.
            NAME=$("$PYTHON" -c 'import sys, urllib.parse as u; print(u.urlsplit(sys.argv[1]).path.rsplit("/", 1)[-1])' "$WHEEL")
            case "$NAME" in *.whl) ;; *) die "--wheel URL must name a .whl file" ;; esac
            # With --download-identity: an Entra ID token for Azure Storage from IMDS (never through
            # a proxy), as the Custom Script extension does for its fileUris.
            "$PYTHON" -c 'import json, shutil, sys, urllib.parse, urllib.request as r
url, out, client_id = sys.argv[1:4]
headers = {}
if client_id:
    imds = r.build_opener(r.ProxyHandler({}))
    query = urllib.parse.urlencode({"api-version": "2018-02-01", "resource": "https://storage.azure.com/", "client_id": client_id})
    req = r.Request("http://169.254.169.254/metadata/identity/oauth2/token?" + query, headers={"Metadata": "true"})
    with imds.open(req, timeout=30) as answer:
        headers = {"Authorization": "Bearer " + json.load(answer)["access_token"], "x-ms-version": "2021-08-06"}
with r.urlopen(r.Request(url, headers=headers), timeout=120) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)' "$WHEEL" "$WORK/$NAME" "$DOWNLOAD_IDENTITY" 2>/dev/null ||
                die "cannot download the wheel (URL not shown: it may hold a token)"
            WHEEL=$WORK/$NAME
            ;;
        *) [ -f "$WHEEL" ] || die "--wheel $WHEEL: no such file" ;;
    esac
    TARGET=$WHEEL
else
    TARGET=$PACKAGE
fi
[ -n "$EXTRAS" ] && TARGET="$TARGET[$EXTRAS]"

pip_install() {
    # "$@" are extra arguments; the options file is appended one argument per line.
    set -- "$@"
    while IFS= read -r arg; do set -- "$@" "$arg"; done <"$PIP_ARGS"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet "$@" >&2
}
log "installing $(basename "$TARGET")"
pip_install --upgrade "$TARGET" || die "pip install failed"
if [ -n "$WHEEL" ]; then
    # Same version number, different build (a rebuilt wheel): make sure this exact file is installed.
    pip_install --no-deps --force-reinstall "$WHEEL" || die "pip install of $WHEEL failed"
fi
VERSION=$("$VENV/bin/se-bridge" --version) || die "the installed se-bridge does not run"
log "installed $VERSION"

# -- 4 + 5. secrets and configuration ----------------------------------------------------------------
# Rendering and validation run in the venv's Python so the package's own settings table decides what
# a valid configuration is (unknown keys and bad values are refused here, before anything restarts).
OWNER=
[ "$REAL" = 1 ] && OWNER=$SVC_USER
RESULT=$WORK/render-result
SEB_ROOT=$ROOT SEB_ETC=$ETC SEB_STATE=$STATE SEB_APPROVER_STATE=$APPROVER_STATE SEB_LOGS=$LOGS \
SEB_ROLE=$ROLE SEB_AZURE_STATE=$AZURE_STATE \
SEB_SETTINGS_FILE=$SETTINGS_FILE SEB_SETTINGS_B64=$SETTINGS_B64 SEB_SECRETS=$SECRETS_JSON \
SEB_SINKS=$SINKS SEB_POLL_INTERVAL=$POLL_INTERVAL SEB_APPROVER_SOURCE=$APPROVER_SOURCE \
SEB_APPROVER_RELAY=$APPROVER_RELAY SEB_APPROVER_MODE=$APPROVER_MODE SEB_APPROVER_KEYS=$APPROVER_KEYS \
SEB_APPROVER_SINKS=$APPROVER_SINKS SEB_FORCE=$FORCE_CONFIG SEB_OWNER=$OWNER SEB_RESULT=$RESULT \
    "$VENV/bin/python" -m bridge.commands.install_config || die "configuration refused (nothing was changed)"
CONFIG_RESULT=$(sed -n 's/^config=//p' "$RESULT")
APPROVER_ON=$(sed -n 's/^approver=//p' "$RESULT")
AGENT_ON=$(sed -n 's/^agent=//p' "$RESULT")
AZURE_ON=$(sed -n 's/^azure_channel=//p' "$RESULT")
log "config $ETC/config.toml: $CONFIG_RESULT; approver: $([ "$APPROVER_ON" = 1 ] && echo enabled || echo disabled); agent: $([ "$AGENT_ON" = 1 ] && echo enabled || echo disabled); azure-channel: $([ "$AZURE_ON" = 1 ] && echo enabled || echo disabled)"

# -- 6. systemd units --------------------------------------------------------------------------------
# Hardening: a dedicated account, read-only OS (ProtectSystem=strict) with the state and log
# directories created and owned by systemd, no privilege gain, no capabilities, only the address
# families HTTP and AMQP/Kafka need, and the system-service syscall set. Restart=always because the
# agent is the only thing that can see maintenance coming: it must come back after any exit.
write_unit() {
    # $1 unit name, $2 description, $3 ExecStart arguments, $4 state directory name, $5 extra [Unit]
    tmp=$UNITS/.$1.new
    cat >"$tmp" <<EOF
# Installed by the Scheduled Events bridge installer ($VERSION); re-running it rewrites this file.
# Local changes belong in a drop-in: systemctl edit $1
[Unit]
Description=$2
Documentation=https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events
Wants=network-online.target
After=network-online.target$5

[Service]
Type=simple
User=$SVC_USER
Group=$SVC_USER
EnvironmentFile=-$ETC/environment
ExecStart=$VENV/bin/se-bridge $3 --config $ETC/config.toml
Restart=always
RestartSec=5
TimeoutStopSec=30
# systemd's default soft limit is 1024 fds; the listener, a broker client's sockets and the outbox
# segments share it. Running out (EMFILE) is survived, but must not be the normal state.
LimitNOFILE=65536
StateDirectory=$4
StateDirectoryMode=0700
LogsDirectory=se-bridge
LogsDirectoryMode=0750
UMask=0077
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
CapabilityBoundingSet=
AmbientCapabilities=
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
EOF
    chmod 0644 "$tmp"
    mv -f "$tmp" "$UNITS/$1"
}
write_unit se-bridge-agent.service "Azure Scheduled Events bridge agent" agent se-bridge ""
# A local approver relays through the agent beside it; a central (fleet) one through the fleet's agents.
APPROVER_AFTER=""
[ "$AGENT_ON" = 1 ] && APPROVER_AFTER="${NL}Wants=se-bridge-agent.service${NL}After=se-bridge-agent.service"
write_unit se-bridge-approver.service "Azure Scheduled Events bridge approver" approver \
    se-bridge-approver "$APPROVER_AFTER"
write_unit se-bridge-azure-channel.service "Azure Scheduled Events bridge: Azure's channel" azure-channel \
    se-bridge-azure ""

if [ "$REAL" = 0 ] || [ "$NO_START" = 1 ] || [ ! -d /run/systemd/system ]; then
    log "files installed under ${ROOT:-/}; systemd not touched"
    exit 0
fi
systemctl daemon-reload
# restart, not start: a second run must load the upgraded package.
for pair in "se-bridge-agent:$AGENT_ON" "se-bridge-approver:$APPROVER_ON" "se-bridge-azure-channel:$AZURE_ON"; do
    unit=${pair%%:*}.service
    if [ "${pair##*:}" = 1 ]; then
        systemctl enable --quiet "$unit"
        systemctl restart "$unit"
    else
        systemctl disable --quiet --now "$unit" 2>/dev/null || true
    fi
done
# Every enabled service (the agent, and the approver when configured) must answer /healthz on the
# listener its config names; a failing start is reported here, so the VM extension shows it as failed
# instead of a service restarted every 5 s behind a successful deployment.
if ! "$VENV/bin/python" -m bridge.commands.install_health "$ETC/config.toml" --timeout 60; then
    for pair in "se-bridge-agent:$AGENT_ON" "se-bridge-approver:$APPROVER_ON" "se-bridge-azure-channel:$AZURE_ON"; do
        if [ "${pair##*:}" = 1 ]; then journalctl -u "${pair%%:*}.service" -n 40 --no-pager >&2 || true; fi
    done
    die "a service did not become healthy within 60 s (journal above)"
fi
log "done: $VERSION"
