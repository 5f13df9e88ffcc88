#!/usr/bin/env python3
"""Add the se-bridge VM Application version to VMs and scale sets that already exist.

    deploy/enable_vm_application.py [--dry-run] [--update-instances] [--identity IDENTITY_ID] \
        --version-id VERSION_ID RESOURCE_ID...

VERSION_ID is infra/modules/vm-application.bicep's ``applicationVersionId`` output; each RESOURCE_ID
a VM (.../virtualMachines/NAME) or a scale set (.../virtualMachineScaleSets/NAME).

Why a script: a template that defines the VM or scale set puts the module's ``galleryApplication``
output in its ``applicationProfile``; one deployed from elsewhere cannot be patched by a Bicep file
without redeclaring its whole model. ``az vm update`` / ``az vmss update`` read the model, change one
property and write it back. The VM's other applications are kept: the script reads the current
``galleryApplications`` list and writes it back with this application's entry added, or replacing an
older version of the same application (a VM takes one version of an application). Every id is checked
before anything changes. A scale set whose upgrade policy is Manual gives its instances the change with
``az vmss update-instances`` (``--update-instances``). ``--identity`` first attaches the agents'
user-assigned identity (infra output ``agentIdentityResourceId``) with ``az vm|vmss identity assign``,
which keeps the identities a VM already has: the agent publishes and reads keys with it. Needs the
Azure CLI, signed in with rights to update the resources.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from typing import Any


def _resource_id(path: str) -> re.Pattern[str]:
    """A resource id in a resource group: /subscriptions/S/resourceGroups/R/providers/<path>."""
    return re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/" + path + "$", re.I)


VM = _resource_id(r"Microsoft\.Compute/virtualMachines/[^/]+")
VMSS = _resource_id(r"Microsoft\.Compute/virtualMachineScaleSets/[^/]+")
IDENTITY = _resource_id(r"Microsoft\.ManagedIdentity/userAssignedIdentities/[^/]+")
VERSION = _resource_id(r"Microsoft\.Compute/galleries/[^/]+/applications/[^/]+/versions/\d+\.\d+\.\d+")


class Refused(Exception):
    """An argument that would change the wrong thing: nothing is changed."""


def profile_path(resource_id: str) -> str:
    return "virtualMachineProfile.applicationProfile" if VMSS.match(resource_id) else "applicationProfile"


def merged(
    current: list[dict[str, Any]] | None, version_id: str, fail_deployment: bool
) -> list[dict[str, Any]]:
    """``current`` with this application's entry added or replacing another version of it."""
    application = version_id.lower().rpartition("/versions/")[0] + "/versions/"  # any version of it
    keep = [
        a for a in current or [] if not str(a.get("packageReferenceId", "")).lower().startswith(application)
    ]
    return [*keep, {"packageReferenceId": version_id, "treatFailureAsDeploymentFailure": fail_deployment}]


def az(*args: str) -> str:
    try:
        done = subprocess.run(["az", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:  # said in one line, not as a traceback
        raise RuntimeError(
            "the Azure CLI (az) is not installed or not on PATH: https://learn.microsoft.com/cli/azure/install-azure-cli"
        ) from None
    if done.returncode != 0:
        raise RuntimeError(f"az {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done.stdout


def enable(resource_id: str, version_id: str, options: argparse.Namespace) -> list[str]:
    """What was done (or, with ``--dry-run``, the ``az`` commands that would run) for one VM or scale
    set: its identity, its application list, its instances."""
    group = "vmss" if VMSS.match(resource_id) else "vm"
    commands = []
    if options.identity:  # kept as is when already attached: `identity assign` adds, never replaces
        commands.append([group, "identity", "assign", "--ids", resource_id, "--identities", options.identity])
    update = application_update(group, resource_id, version_id, options.fail_deployment)
    if update is not None:
        commands.append(update)
        if group == "vmss" and options.update_instances:
            commands.append(["vmss", "update-instances", "--ids", resource_id, "--instance-ids", "*"])
    if options.dry_run:
        return ["az " + " ".join(c) for c in commands] or [f"already set: {resource_id}"]
    for command in commands:
        az(*command, "--output", "none")
    return [f"application set: {resource_id}" if update else f"already set: {resource_id}"]


def application_update(
    group: str, resource_id: str, version_id: str, fail_deployment: bool
) -> list[str] | None:
    """The ``az ... update`` that writes the application list, or None when it is already right."""
    path = profile_path(resource_id)
    shown = az(group, "show", "--ids", resource_id, "--query", path, "--output", "json").strip()
    profile = json.loads(shown) if shown else None
    current = (profile or {}).get("galleryApplications")
    wanted = merged(current, version_id, fail_deployment)
    if current == wanted:
        return None
    # A model without an applicationProfile gets the whole block (a generic --set cannot reach into a
    # property that is null); otherwise only its list, so other applicationProfile settings stay.
    if profile is None:
        assignment = f"{path}={json.dumps({'galleryApplications': wanted})}"
    else:
        assignment = f"{path}.galleryApplications={json.dumps(wanted)}"
    return [group, "update", "--ids", resource_id, "--set", assignment]


def check(resource_ids: list[str], version_id: str, identity: str | None) -> None:
    if not VERSION.match(version_id):
        raise Refused(
            f"not a gallery application version id (.../applications/NAME/versions/X.Y.Z): {version_id}"
        )
    if identity and not IDENTITY.match(identity):
        raise Refused(f"not a user-assigned identity resource id: {identity}")
    for resource_id in resource_ids:
        if not (VM.match(resource_id) or VMSS.match(resource_id)):
            raise Refused(
                f"not a VM or scale set resource id (a scale-set instance: use its scale set): {resource_id}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version-id", required=True, help="the application version's resource id")
    parser.add_argument("--identity", help="attach this user-assigned identity first (the agents')")
    parser.add_argument("--dry-run", action="store_true", help="print the az commands, change nothing")
    parser.add_argument("--update-instances", action="store_true", help="scale sets: update the instances")
    parser.add_argument(
        "--no-fail-deployment", dest="fail_deployment", action="store_false",
        help="do not mark the VM's deployment failed when the install fails (the platform's default)",
    )  # fmt: skip
    parser.add_argument("resource_ids", nargs="+", metavar="RESOURCE_ID")
    args = parser.parse_args(argv)
    try:
        check(args.resource_ids, args.version_id, args.identity)  # every id before the first change
        for resource_id in args.resource_ids:
            print("\n".join(enable(resource_id, args.version_id, args)))
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
