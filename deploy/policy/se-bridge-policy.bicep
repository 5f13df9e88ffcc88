// Azure Policy for a fleet: every Linux VM in scope tagged se-bridge=enabled gets the bridge installed
// (DeployIfNotExists), including VMs created later; a remediation task covers the existing ones.
//
// What it deploys is deploy/vm-extension.bicep itself, published once as a template spec:
//
//   az ts create -g rg-se-bridge -n se-bridge-vm-extension -v 1.0 -f deploy/vm-extension.bicep
//   az deployment sub create -l westeurope -f deploy/policy/se-bridge-policy.bicep \
//     -p templateSpecVersionId=$(az ts show -g rg-se-bridge -n se-bridge-vm-extension -v 1.0 --query id -o tsv) \
//        assignmentResourceGroup=rg-app eventHubsNamespaceFqdn=... agentIdentityClientId=... wheelUri=...
//   az policy remediation create -g rg-app -n se-bridge --policy-assignment se-bridge-install
//
// No secret goes through the policy (its parameters are readable): keys are Key Vault references in
// agentSettings / approverSettings. The agents' identity must be on each VM: attach it with
// deploy/policy/se-bridge-identity-policy.bicep (tagged VMs only), or at creation.
targetScope = 'subscription'

@description('Resource id of the template spec version of deploy/vm-extension.bicep (az ts create).')
param templateSpecVersionId string

@description('Resource group whose VMs the assignment covers (one assignment per group: repeat, or assign the definition at a management group).')
param assignmentResourceGroup string

@description('Region of the assignment\'s managed identity.')
param location string = deployment().location

@description('Event Hubs host name (infra output eventHubsNamespaceFqdn).')
param eventHubsNamespaceFqdn string

@description('Client id of the agents\' user-assigned identity (infra output agentIdentityClientId).')
param agentIdentityClientId string

@description('Blob URL of the wheel in the artifacts container; empty: the package index.')
param wheelUri string = ''

@description('More [agent] settings (no secrets: Key Vault references for keys).')
param agentSettings object = {}

@description('DeployIfNotExists, or AuditIfNotExists to see what would be installed first.')
@allowed([
  'DeployIfNotExists'
  'AuditIfNotExists'
  'Disabled'
])
param effect string = 'DeployIfNotExists'

// Virtual Machine Contributor: what the remediation deployment needs to create a Run Command on a VM.
var virtualMachineContributor = '9980e02c-c2be-4d73-94e8-173b1dc7cf3c'

resource definition 'Microsoft.Authorization/policyDefinitions@2023-04-01' = {
  name: 'se-bridge-install'
  properties: {
    policyType: 'Custom'
    mode: 'Indexed'
    displayName: 'Install the Scheduled Events bridge on tagged Linux VMs'
    description: 'Deploys deploy/vm-extension.bicep (a template spec) as the Run Command se-bridge-install on every Linux VM tagged se-bridge=enabled that has none that succeeded.'
    metadata: {
      category: 'Compute'
    }
    parameters: {
      effect: {
        type: 'String'
        allowedValues: [
          'DeployIfNotExists'
          'AuditIfNotExists'
          'Disabled'
        ]
        defaultValue: 'DeployIfNotExists'
      }
      templateSpecVersionId: {
        type: 'String'
      }
      eventHubsNamespaceFqdn: {
        type: 'String'
      }
      agentIdentityClientId: {
        type: 'String'
      }
      wheelUri: {
        type: 'String'
        defaultValue: ''
      }
      agentSettings: {
        type: 'Object'
        defaultValue: {}
      }
    }
    policyRule: {
      if: {
        allOf: [
          {
            field: 'type'
            equals: 'Microsoft.Compute/virtualMachines'
          }
          {
            field: 'Microsoft.Compute/virtualMachines/storageProfile.osDisk.osType'
            equals: 'Linux'
          }
          {
            field: 'tags[se-bridge]'
            equals: 'enabled'
          }
        ]
      }
      then: {
        effect: '[parameters(\'effect\')]'
        details: {
          type: 'Microsoft.Compute/virtualMachines/runCommands'
          name: 'se-bridge-install'
          existenceCondition: {
            field: 'Microsoft.Compute/virtualMachines/runCommands/provisioningState'
            equals: 'Succeeded'
          }
          roleDefinitionIds: [
            '/providers/Microsoft.Authorization/roleDefinitions/${virtualMachineContributor}'
          ]
          deployment: {
            properties: {
              mode: 'incremental'
              parameters: {
                vmName: {
                  value: '[field(\'name\')]'
                }
                location: {
                  value: '[field(\'location\')]'
                }
                templateSpecVersionId: {
                  value: '[parameters(\'templateSpecVersionId\')]'
                }
                eventHubsNamespaceFqdn: {
                  value: '[parameters(\'eventHubsNamespaceFqdn\')]'
                }
                agentIdentityClientId: {
                  value: '[parameters(\'agentIdentityClientId\')]'
                }
                wheelUri: {
                  value: '[parameters(\'wheelUri\')]'
                }
                agentSettings: {
                  value: '[parameters(\'agentSettings\')]'
                }
              }
              template: {
                '$schema': 'https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#'
                contentVersion: '1.0.0.0'
                parameters: {
                  vmName: {
                    type: 'string'
                  }
                  location: {
                    type: 'string'
                  }
                  templateSpecVersionId: {
                    type: 'string'
                  }
                  eventHubsNamespaceFqdn: {
                    type: 'string'
                  }
                  agentIdentityClientId: {
                    type: 'string'
                  }
                  wheelUri: {
                    type: 'string'
                  }
                  agentSettings: {
                    type: 'object'
                  }
                }
                resources: [
                  {
                    type: 'Microsoft.Resources/deployments'
                    apiVersion: '2022-09-01'
                    name: '[concat(\'se-bridge-\', parameters(\'vmName\'))]'
                    properties: {
                      mode: 'Incremental'
                      templateLink: {
                        id: '[parameters(\'templateSpecVersionId\')]'
                      }
                      parameters: {
                        osType: {
                          value: 'Linux'
                        }
                        vmName: {
                          value: '[parameters(\'vmName\')]'
                        }
                        location: {
                          value: '[parameters(\'location\')]'
                        }
                        eventHubsNamespaceFqdn: {
                          value: '[parameters(\'eventHubsNamespaceFqdn\')]'
                        }
                        agentIdentityClientId: {
                          value: '[parameters(\'agentIdentityClientId\')]'
                        }
                        wheelUri: {
                          value: '[parameters(\'wheelUri\')]'
                        }
                        agentSettings: {
                          value: '[parameters(\'agentSettings\')]'
                        }
                        installWith: {
                          value: 'RunCommand'
                        }
                      }
                    }
                  }
                ]
              }
            }
          }
        }
      }
    }
  }
}

module assignment 'policy-assignment.bicep' = {
  name: 'se-bridge-install-assignment'
  scope: resourceGroup(assignmentResourceGroup)
  params: {
    name: 'se-bridge-install'
    displayName: definition.properties.displayName
    definitionId: definition.id
    location: location
    parameters: {
      effect: {
        value: effect
      }
      templateSpecVersionId: {
        value: templateSpecVersionId
      }
      eventHubsNamespaceFqdn: {
        value: eventHubsNamespaceFqdn
      }
      agentIdentityClientId: {
        value: agentIdentityClientId
      }
      wheelUri: {
        value: wheelUri
      }
      agentSettings: {
        value: agentSettings
      }
    }
    roleDefinitionId: virtualMachineContributor
    purpose: 'creates the se-bridge-install Run Command on the VMs of this group'
  }
}

// The remediation deploys from the template spec with the assignment's identity: it must be able to
// read the spec, which lives in its own group (/subscriptions/S/resourceGroups/R/providers/
// Microsoft.Resources/templateSpecs/NAME/versions/V).
var specParts = split(templateSpecVersionId, '/')

module specReader 'template-spec-reader.bicep' = {
  name: 'se-bridge-install-template-spec-reader'
  scope: resourceGroup(specParts[2], specParts[4])
  params: {
    templateSpecName: specParts[8]
    principalId: assignment.outputs.principalId
  }
}

@description('The policy definition (assign it elsewhere too: a management group covers a fleet).')
output definitionId string = definition.id
