#!/bin/sh
# se-bridge as a VM Application (Azure Compute Gallery): the install, update and remove actions.
#
# The VM Application manager downloads the version's package and the configuration into
# /var/lib/waagent/Microsoft.CPlat.Core.VMApplicationManagerLinux/<application>/<version>, names them
# as the version's settings say (packageFileName se-bridge.tar.gz, configFileName
# se-bridge-settings.json: infra/modules/vm-application.bicep) and runs the version's commands there
# with /bin/bash, as root. Those commands unpack the package and call this script:
#
#   manage.sh install|update SETTINGS_FILE    install or upgrade in place from the bundled wheels
#   manage.sh remove                          stop and remove the services and the virtual environment
#
# The package carries the project's wheel and every dependency's wheel (deploy/vmapp/build_package.py),
# so a VM without access to a package index installs it (pip --no-index). The settings are the
# installer's --settings JSON ({"agent": {...}, "approver": {...}}). A VM Application has no
# protected settings: the configuration blob is readable by whoever can read the storage account, so
# it must hold no secret. Keys and connection strings stay in Key Vault and the settings name them
# (https://<vault>.vault.azure.net/secrets/<name> wherever a key file goes; the VM's managed identity
# reads them).
#
# remove keeps /etc/se-bridge and the state directories: an outbox may still hold records no sink has
# confirmed, and a reinstall picks them up.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=${SE_BRIDGE_ROOT:-}
ROOT=${ROOT%/}
PROG=se-bridge-vmapp

die() { echo "$PROG: $*" >&2; exit 1; }

install_or_update() {
    settings=${1:-}
    [ -n "$settings" ] || die "no settings file given"
    [ -f "$settings" ] || die "settings file $settings not found: give the application version a \
defaultConfigurationLink or the VM's galleryApplications entry a configurationReference"
    set -- "$HERE"/wheels/scheduled_events_bridge-*.whl
    [ -f "$1" ] || die "the package holds no scheduled_events_bridge wheel"
    wheel=$1
    extras=$(cat "$HERE/EXTRAS")
    exec sh "$HERE/install.sh" --force-config --no-index --find-links "$HERE/wheels" \
        --wheel "$wheel" --extras "$extras" --settings "$settings"
}

remove() {
    units="se-bridge-azure-channel.service se-bridge-approver.service se-bridge-agent.service"
    if [ -z "$ROOT" ]; then
        for unit in $units; do
            systemctl disable --quiet --now "$unit" 2>/dev/null || true
        done
    fi
    for unit in $units; do
        rm -f "$ROOT/etc/systemd/system/$unit"
    done
    [ -n "$ROOT" ] || systemctl daemon-reload
    rm -rf "$ROOT/opt/se-bridge"
    echo "$PROG: removed the services and /opt/se-bridge; /etc/se-bridge and the state directories are kept"
}

case "${1:-}" in
    install|update) shift; install_or_update "$@" ;;
    remove) remove ;;
    *) echo "usage: $0 install|update SETTINGS_FILE | remove" >&2; exit 2 ;;
esac
