#!/bin/sh
# Turn on scheduledEventsPolicy for VMs, scale sets and availability sets that already exist (issue 12):
# Scheduled Events are then published to Event Grid and Azure Resource Graph as well as IMDS. This is a
# preview of Azure's (feature SendScheduledEventsPolicy of Microsoft.Compute, which Microsoft does not
# yet recommend for production workloads): the script checks the subscription has it before it changes
# anything.
#
#   deploy/enable-scheduled-events-policy.sh [--dry-run] [--events-api-version 2020-07-01 | --no-events-api-version]
#       [--all-instances-down-approve true|false] RESOURCE_ID...
#
# Each id is a VM (.../Microsoft.Compute/virtualMachines/NAME), a scale set
# (.../virtualMachineScaleSets/NAME) or an availability set (.../availabilitySets/NAME). The policy
# belongs to a scale set or an availability set as a whole ("all VMs in the same scale set or
# availability set are required to have the same scheduled events policy"): a VM that is a member of
# one is refused, naming the parent to give instead. `az vm update` / `az vmss update` /
# `az vm availability-set update` read the resource, set the block and write the whole model back: the
# supported way to change one property of a resource deployed from elsewhere
# (infra/modules/scheduled-events-policy.bicep is for templates that define the resource).
#
# --events-api-version pins the Scheduled Events schema Event Grid delivers (scheduledEventsApiVersion):
# during the preview its only value is 2020-07-01, the default; another is refused (issue 34).
# --all-instances-down-approve sets allInstancesDown.automaticallyApprove (Azure's default: true). Both
# need Microsoft.Compute 2025-04-01 on Azure's side and an Azure CLI recent enough to send them.
# --no-events-api-version leaves the property out (a CLI or region still on an older api-version).
#
# Preview prerequisites, checked before anything changes: the feature SendScheduledEventsPolicy of
# Microsoft.Compute (refused without it), and ScheduledEventsActivity of Microsoft.Maintenance, which
# Microsoft's current preview page lists as well (warned about, not refused: its effect is not
# documented elsewhere, and a subscription without it still gets the policy set). User-initiated reboots and redeploys stay for the agent and its approvers to approve
# (automaticallyApprove false). Needs the Azure CLI, signed in with rights to update the resources.
set -eu

dry_run=0
# The only schema version the preview delivers (Microsoft's page); the Azure channel's reader parses it.
PREVIEW_EVENTS_API_VERSION="2020-07-01"
events_api_version="$PREVIEW_EVENTS_API_VERSION"
all_down=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1; shift ;;
        --events-api-version) events_api_version="${2:?--events-api-version needs a value}"; shift 2 ;;
        --no-events-api-version) events_api_version=""; shift ;;
        --all-instances-down-approve)
            all_down="${2:?--all-instances-down-approve needs true or false}"; shift 2
            case "$all_down" in true|false) ;; *) echo "--all-instances-down-approve: true or false" >&2; exit 2 ;; esac ;;
        --) shift; break ;;
        -*) echo "unknown option: $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [ "$#" -eq 0 ]; then
    echo "usage: $0 [--dry-run] [--events-api-version 2020-07-01 | --no-events-api-version] [--all-instances-down-approve true|false] RESOURCE_ID..." >&2
    exit 2
fi
case "$events_api_version" in
    ""|"$PREVIEW_EVENTS_API_VERSION") ;;
    *) echo "--events-api-version: during the preview the only value is $PREVIEW_EVENTS_API_VERSION (got $events_api_version)" >&2; exit 2 ;;
esac

targets='"enable":true'
[ -n "$events_api_version" ] && targets="$targets,\"scheduledEventsApiVersion\":\"$events_api_version\""
POLICY="{\"scheduledEventsAdditionalPublishingTargets\":{\"eventGridAndResourceGraph\":{$targets}},\"userInitiatedReboot\":{\"automaticallyApprove\":false},\"userInitiatedRedeploy\":{\"automaticallyApprove\":false}"
[ -n "$all_down" ] && POLICY="$POLICY,\"allInstancesDown\":{\"automaticallyApprove\":$all_down}"
POLICY="$POLICY}"

# Every id is checked before anything is changed: a typo must not leave half the fleet updated.
for id in "$@"; do
    case "$id" in
        */virtualMachineScaleSets/*/virtualMachines/*|*/virtualmachinescalesets/*/virtualmachines/*)
            echo "scale-set instance: its scale set holds the policy, give that instead: ${id%/virtual[Mm]achines/*}" >&2
            exit 2 ;;
        /subscriptions/*/[Mm]icrosoft.[Cc]ompute/[Vv]irtual[Mm]achines/*) ;;
        /subscriptions/*/[Mm]icrosoft.[Cc]ompute/[Vv]irtual[Mm]achine[Ss]cale[Ss]ets/*) ;;
        /subscriptions/*/[Mm]icrosoft.[Cc]ompute/[Aa]vailability[Ss]ets/*) ;;
        *) echo "not a VM, scale set or availability set resource id: $id" >&2; exit 2 ;;
    esac
done

if [ "$dry_run" -eq 0 ]; then
    if ! command -v az >/dev/null 2>&1; then
        echo "the Azure CLI (az) is not installed or not on PATH: https://learn.microsoft.com/cli/azure/install-azure-cli" >&2
        exit 3
    fi
    # feature NAMESPACE NAME: 0 when registered in this subscription; else says how to register it.
    feature() {
        state=$(az feature show --namespace "$1" --name "$2" --query properties.state --output tsv 2>/dev/null || true)
        [ "$state" = "Registered" ] && return 0
        echo "the preview feature $1/$2 is not registered in this subscription (state: ${state:-unknown});" >&2
        echo "  az feature register --namespace $1 --name $2" >&2
        echo "  az provider register --namespace $1   (once the feature says Registered)" >&2
        return 1
    }
    feature Microsoft.Compute SendScheduledEventsPolicy || exit 3
    # Listed by Microsoft's current preview page too; not documented elsewhere: a warning, not a refusal.
    if ! feature Microsoft.Maintenance ScheduledEventsActivity; then
        echo "warning: without Microsoft.Maintenance/ScheduledEventsActivity Event Grid may deliver nothing" >&2
    fi
    # A VM in an availability set or a (Flexible) scale set shares its parent's policy.
    for id in "$@"; do
        case "$id" in */[Vv]irtual[Mm]achine[Ss]cale[Ss]ets/*|*/[Aa]vailability[Ss]ets/*) continue ;; esac
        parent=$(az vm show --ids "$id" --query "availabilitySet.id || virtualMachineScaleSet.id" --output tsv)
        if [ -n "$parent" ]; then
            echo "$id is a member of $parent: the policy is set on the parent for all its members; give $parent instead" >&2
            exit 2
        fi
    done
fi

for id in "$@"; do
    case "$id" in
        */[Vv]irtual[Mm]achine[Ss]cale[Ss]ets/*) command="vmss update" ;;
        */[Aa]vailability[Ss]ets/*) command="vm availability-set update" ;;
        *) command="vm update" ;;
    esac
    if [ "$dry_run" -eq 1 ]; then
        echo "az $command --ids $id --set scheduledEventsPolicy=$POLICY"
    else
        # shellcheck disable=SC2086 # the command is two or three words on purpose
        az $command --ids "$id" --set "scheduledEventsPolicy=$POLICY" --output none
        echo "scheduledEventsPolicy set: $id"
    fi
done
