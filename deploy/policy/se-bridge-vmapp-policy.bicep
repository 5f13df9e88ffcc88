// Azure Policy for a fleet by VM Application: every Linux VM and scale set in scope tagged
// se-bridge=enabled gets the se-bridge application version in its applicationProfile (effect
// `modify`, as Microsoft's "Govern and enforce compliance for VM Applications with Azure Policy"
// shows it): new VMs and scale sets at creation, existing ones by a remediation task. One definition
// per resource type, as that page advises.
//
//   az deployment sub create -l westeurope -f deploy/policy/se-bridge-vmapp-policy.bicep \
//     -p applicationVersionId=<infra output vmApplicationVersionId> assignmentResourceGroup=rg-app
//   az policy remediation create -g rg-app -n se-bridge-vm --policy-assignment se-bridge-vmapp-vm
//   az policy remediation create -g rg-app -n se-bridge-vmss --policy-assignment se-bridge-vmapp-vmss
//
// Remediate in waves (a remediation task per region or resource group). A scale set with a Manual
// upgrade policy gives its instances the application on `az vmss update-instances`. A VM that
// already has another version of the application is compliant (one version per VM): upgrades are
// deploy/enable_vm_application.py with the new version id, or a new assignment with it. No secret goes
// through the policy. The agents' identity must be on the VMs too:
// deploy/policy/se-bridge-identity-policy.bicep attaches it to the same tagged resources.
targetScope = 'subscription'

@description('The VM Application version to install (infra output vmApplicationVersionId: .../galleries/G/applications/A/versions/X.Y.Z).')
param applicationVersionId string

@description('Resource group whose VMs and scale sets the assignments cover (one per group: repeat, or assign the definitions at a management group).')
param assignmentResourceGroup string

@description('Region of the assignments\' managed identities.')
param location string = deployment().location

@description('Modify, or Disabled.')
@allowed([
  'Modify'
  'Disabled'
])
param effect string = 'Modify'

// Virtual Machine Contributor: what a remediation needs to change a VM's or scale set's model.
var virtualMachineContributor = '9980e02c-c2be-4d73-94e8-173b1dc7cf3c'
// .../subscriptions/S/resourceGroups/R/providers/Microsoft.Compute/galleries/G/applications/A/versions/V
var idParts = split(applicationVersionId, '/')
var kinds = [
  {
    key: 'vm'
    type: 'Microsoft.Compute/virtualMachines'
    fields: 'Microsoft.Compute/virtualMachines/'
    what: 'Linux VMs'
  }
  {
    key: 'vmss'
    type: 'Microsoft.Compute/virtualMachineScaleSets'
    fields: 'Microsoft.Compute/virtualMachineScaleSets/virtualMachineProfile.'
    what: 'Linux scale sets'
  }
]

resource definitions 'Microsoft.Authorization/policyDefinitions@2023-04-01' = [for kind in kinds: {
  name: 'se-bridge-vmapp-${kind.key}'
  properties: {
    policyType: 'Custom'
    mode: 'Indexed'
    displayName: 'Add the Scheduled Events bridge VM Application to tagged ${kind.what}'
    description: 'Adds the se-bridge VM Application version to applicationProfile.galleryApplications of ${kind.what} tagged se-bridge=enabled that have no version of it.'
    metadata: {
      category: 'Compute'
    }
    parameters: {
      effect: {
        type: 'String'
        allowedValues: [
          'Modify'
          'Disabled'
        ]
        defaultValue: 'Modify'
      }
      subscriptionId: {
        type: 'String'
      }
      resourceGroup: {
        type: 'String'
      }
      galleryName: {
        type: 'String'
      }
      applicationName: {
        type: 'String'
      }
      applicationVersion: {
        type: 'String'
      }
    }
    policyRule: {
      if: {
        allOf: [
          {
            field: 'type'
            equals: kind.type
          }
          {
            field: '${kind.fields}storageProfile.osDisk.osType'
            equals: 'Linux'
          }
          {
            field: 'tags[se-bridge]'
            equals: 'enabled'
          }
          {
            count: {
              field: '${kind.fields}applicationProfile.galleryApplications[*]'
              where: {
                field: '${kind.fields}applicationProfile.galleryApplications[*].packageReferenceId'
                contains: '[concat(\'/galleries/\', parameters(\'galleryName\'), \'/applications/\', parameters(\'applicationName\'), \'/\')]'
              }
            }
            equals: 0
          }
        ]
      }
      then: {
        effect: '[parameters(\'effect\')]'
        details: {
          roleDefinitionIds: [
            '/providers/Microsoft.Authorization/roleDefinitions/${virtualMachineContributor}'
          ]
          // A request the operation cannot apply to (an older api-version without applicationProfile,
          // another policy writing the same array) is audited, never denied: modify's default
          // conflictEffect, deny, would refuse VM creations that have nothing to do with the bridge.
          conflictEffect: 'audit'
          operations: [
            {
              // The [*] alias appends one element; the array alias itself (Microsoft's sample) would
              // replace the VM's other gallery applications. An alias that is not Modifiable in the
              // request's api-version falls back to conflictEffect: with audit, a silent no-op.
              // docs/deploy.md says how to check it with Get-AzPolicyAlias before relying on it.
              operation: 'add'
              field: '${kind.fields}applicationProfile.galleryApplications[*]'
              value: {
                packageReferenceId: '[concat(\'/subscriptions/\', parameters(\'subscriptionId\'), \'/resourceGroups/\', parameters(\'resourceGroup\'), \'/providers/Microsoft.Compute/galleries/\', parameters(\'galleryName\'), \'/applications/\', parameters(\'applicationName\'), \'/versions/\', parameters(\'applicationVersion\'))]'
                treatFailureAsDeploymentFailure: true
              }
            }
          ]
        }
      }
    }
  }
}]

module assignments 'policy-assignment.bicep' = [for (kind, i) in kinds: {
  name: 'se-bridge-vmapp-${kind.key}-assignment'
  scope: resourceGroup(assignmentResourceGroup)
  params: {
    name: 'se-bridge-vmapp-${kind.key}'
    displayName: definitions[i].properties.displayName
    definitionId: definitions[i].id
    location: location
    parameters: {
      effect: {
        value: effect
      }
      subscriptionId: {
        value: idParts[2]
      }
      resourceGroup: {
        value: idParts[4]
      }
      galleryName: {
        value: idParts[8]
      }
      applicationName: {
        value: idParts[10]
      }
      applicationVersion: {
        value: idParts[12]
      }
    }
    roleDefinitionId: virtualMachineContributor
    purpose: 'adds the se-bridge VM Application to the VMs and scale sets of this group'
  }
}]

@description('The policy definitions, VMs then scale sets (assign them elsewhere too: a management group covers a fleet).')
output definitionIds array = [for (kind, i) in kinds: definitions[i].id]
