#!/bin/sh
# Turn on scheduledEventsPolicy for VMs and scale sets that already exist (issue 12): Scheduled Events
# are then published to Event Grid and Azure Resource Graph as well as IMDS.
#
#   deploy/enable-scheduled-events-policy.sh [--dry-run] RESOURCE_ID...
#
# Each id is a VM (.../Microsoft.Compute/virtualMachines/NAME) or a scale set
# (.../Microsoft.Compute/virtualMachineScaleSets/NAME). `az vm update` / `az vmss update` read the
# resource, set the block and write the whole model back: the supported way to change one property of
# a resource that was deployed from elsewhere (a Bicep redeploy of the VM would need its whole model;
# infra/modules/scheduled-events-policy.bicep is for templates that define the VM).
# User-initiated reboots and redeploys stay for the agent and its approvers to approve
# (automaticallyApprove false). Needs the Azure CLI, signed in with rights to update the resources.
set -eu

POLICY='{"scheduledEventsAdditionalPublishingTargets":{"eventGridAndResourceGraph":{"enable":true}},"userInitiatedReboot":{"automaticallyApprove":false},"userInitiatedRedeploy":{"automaticallyApprove":false}}'
dry_run=0
if [ "${1:-}" = "--dry-run" ]; then dry_run=1; shift; fi
if [ "$#" -eq 0 ]; then
    echo "usage: $0 [--dry-run] RESOURCE_ID..." >&2
    exit 2
fi

# Every id is checked before anything is changed: a typo must not leave half the fleet updated.
for id in "$@"; do
    case "$id" in
        /subscriptions/*/[Mm]icrosoft.[Cc]ompute/[Vv]irtual[Mm]achines/*) ;;
        /subscriptions/*/[Mm]icrosoft.[Cc]ompute/[Vv]irtual[Mm]achine[Ss]cale[Ss]ets/*) ;;
        *) echo "not a VM or scale set resource id: $id" >&2; exit 2 ;;
    esac
    case "$id" in
        */virtualMachineScaleSets/*/virtualMachines/*|*/virtualmachinescalesets/*/virtualmachines/*)
            echo "scale-set instance: set the policy on its scale set instead: $id" >&2; exit 2 ;;
    esac
done

for id in "$@"; do
    case "$id" in
        */[Vv]irtual[Mm]achine[Ss]cale[Ss]ets/*) group=vmss ;;
        *) group=vm ;;
    esac
    if [ "$dry_run" -eq 1 ]; then
        echo "az $group update --ids $id --set scheduledEventsPolicy=$POLICY"
    else
        az "$group" update --ids "$id" --set "scheduledEventsPolicy=$POLICY" --output none
        echo "scheduledEventsPolicy set: $id"
    fi
done
