// Azure Policy for a fleet: every VM and scale set in scope tagged se-bridge=enabled gets the agents'
// user-assigned identity (DeployIfNotExists), which the agent publishes and reads its keys with.
//
//   az deployment sub create -l westeurope -f deploy/policy/se-bridge-identity-policy.bicep \
//     -p agentIdentityResourceId=<infra output agentIdentityResourceId> assignmentResourceGroup=rg-app
//   az policy remediation create -g rg-app -n se-bridge-identity-vm --policy-assignment se-bridge-identity-vm
//   az policy remediation create -g rg-app -n se-bridge-identity-vmss --policy-assignment se-bridge-identity-vmss
//
// Why not Microsoft's built-in "Assign Built-In User-Assigned Managed Identity to Virtual Machines"
// (d367bd60-...) with bringYourOwnUserAssignedManagedIdentity: it has no filter, so every VM of the
// scope would get the agents' identity and with it the right to publish records, read decisions and
// read the approvers' keys in Key Vault; and it needs Contributor on the subscription ("Use Azure
// Policy to assign managed identities"). This one does what that policy's deployment does (read the
// resource's identities, write them back with this one added) for tagged resources only, with
// Virtual Machine Contributor on the assigned group and Managed Identity Operator on the agents'
// identity alone.
//
// Like the built-in, it leaves a resource with exactly one user-assigned identity alone: software on
// it may ask IMDS for a token without naming an identity, which works only while there is one. Attach
// the agents' identity to such a VM by hand once its software names its identity. The same caveat as
// Microsoft's: a deployment changing the VM's identities at the same moment can undo this change
// (remediation assesses it again).
targetScope = 'subscription'

@description('Resource id of the agents\' user-assigned identity (infra output agentIdentityResourceId).')
param agentIdentityResourceId string

@description('Resource group whose VMs and scale sets the assignments cover (one per group: repeat, or assign the definitions at a management group).')
param assignmentResourceGroup string

@description('Region of the assignments\' managed identities.')
param location string = deployment().location

@description('DeployIfNotExists, or AuditIfNotExists to see the list first.')
@allowed([
  'DeployIfNotExists'
  'AuditIfNotExists'
  'Disabled'
])
param effect string = 'DeployIfNotExists'

// Virtual Machine Contributor (write the VM's or scale set's identity) and Managed Identity Operator
// (assign the agents' identity to a resource).
var virtualMachineContributor = '9980e02c-c2be-4d73-94e8-173b1dc7cf3c'
var managedIdentityOperator = 'f1a07417-d97a-45cb-824c-7a7467783830'
// .../subscriptions/S/resourceGroups/R/providers/Microsoft.ManagedIdentity/userAssignedIdentities/NAME
var identityParts = split(agentIdentityResourceId, '/')
var kinds = [
  {
    key: 'vm'
    type: 'Microsoft.Compute/virtualMachines'
    what: 'VMs'
  }
  {
    key: 'vmss'
    type: 'Microsoft.Compute/virtualMachineScaleSets'
    what: 'scale sets'
  }
]

resource definitions 'Microsoft.Authorization/policyDefinitions@2023-04-01' = [for kind in kinds: {
  name: 'se-bridge-identity-${kind.key}'
  properties: {
    policyType: 'Custom'
    mode: 'Indexed'
    displayName: 'Attach the Scheduled Events bridge agents\' identity to tagged ${kind.what}'
    description: 'Adds the agents\' user-assigned identity to ${kind.what} tagged se-bridge=enabled (keeping their identities; one with exactly one user-assigned identity is left alone).'
    metadata: {
      category: 'Managed Identity'
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
      agentIdentityResourceId: {
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
            field: 'tags[se-bridge]'
            equals: 'enabled'
          }
        ]
      }
      then: {
        effect: '[parameters(\'effect\')]'
        details: {
          type: kind.type
          name: '[field(\'name\')]'
          evaluationDelay: 'AfterProvisioning'
          existenceCondition: {
            anyOf: [
              {
                allOf: [
                  {
                    field: 'identity.type'
                    contains: 'UserAssigned'
                  }
                  {
                    field: 'identity.userAssignedIdentities'
                    containsKey: '[parameters(\'agentIdentityResourceId\')]'
                  }
                ]
              }
              {
                allOf: [
                  {
                    field: 'identity.type'
                    equals: 'UserAssigned'
                  }
                  {
                    value: '[string(length(field(\'identity.userAssignedIdentities\')))]'
                    equals: '1'
                  }
                ]
              }
            ]
          }
          roleDefinitionIds: [
            '/providers/Microsoft.Authorization/roleDefinitions/${virtualMachineContributor}'
            '/providers/Microsoft.Authorization/roleDefinitions/${managedIdentityOperator}'
          ]
          deployment: {
            properties: {
              mode: 'incremental'
              parameters: {
                name: {
                  value: '[field(\'name\')]'
                }
                location: {
                  value: '[field(\'location\')]'
                }
                resourceId: {
                  value: '[field(\'id\')]'
                }
                agentIdentityResourceId: {
                  value: '[parameters(\'agentIdentityResourceId\')]'
                }
              }
              template: {
                '$schema': 'https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#'
                contentVersion: '1.0.0.0'
                parameters: {
                  name: {
                    type: 'string'
                  }
                  location: {
                    type: 'string'
                  }
                  resourceId: {
                    type: 'string'
                  }
                  agentIdentityResourceId: {
                    type: 'string'
                  }
                }
                variables: {
                  read: '[concat(\'se-bridge-identity-read-\', uniqueString(deployment().name))]'
                }
                resources: [
                  {
                    // The resource as it is now, identities included ('Full'): read in a deployment of
                    // its own, as the built-in does, so the write below can keep them. Read and written
                    // with the API version the built-in uses (2019-07-01): a write of only the
                    // identity leaves the rest of the model as it is.
                    type: 'Microsoft.Resources/deployments'
                    apiVersion: '2022-09-01'
                    name: '[variables(\'read\')]'
                    properties: {
                      mode: 'Incremental'
                      template: {
                        '$schema': 'https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#'
                        contentVersion: '1.0.0.0'
                        resources: []
                        outputs: {
                          resource: {
                            type: 'object'
                            value: '[reference(parameters(\'resourceId\'), \'2019-07-01\', \'Full\')]'
                          }
                        }
                      }
                    }
                  }
                  {
                    type: 'Microsoft.Resources/deployments'
                    apiVersion: '2022-09-01'
                    name: '[concat(\'se-bridge-identity-\', uniqueString(deployment().name))]'
                    dependsOn: [
                      '[variables(\'read\')]'
                    ]
                    properties: {
                      mode: 'Incremental'
                      expressionEvaluationOptions: {
                        scope: 'inner'
                      }
                      parameters: {
                        name: {
                          value: '[parameters(\'name\')]'
                        }
                        location: {
                          value: '[parameters(\'location\')]'
                        }
                        agentIdentityResourceId: {
                          value: '[parameters(\'agentIdentityResourceId\')]'
                        }
                        identityType: {
                          value: '[if(contains(reference(variables(\'read\')).outputs.resource.value, \'identity\'), reference(variables(\'read\')).outputs.resource.value.identity.type, \'\')]'
                        }
                        userAssignedIdentities: {
                          value: '[if(and(contains(reference(variables(\'read\')).outputs.resource.value, \'identity\'), contains(reference(variables(\'read\')).outputs.resource.value.identity, \'userAssignedIdentities\')), reference(variables(\'read\')).outputs.resource.value.identity.userAssignedIdentities, createObject())]'
                        }
                      }
                      template: {
                        '$schema': 'https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#'
                        contentVersion: '1.0.0.0'
                        parameters: {
                          name: {
                            type: 'string'
                          }
                          location: {
                            type: 'string'
                          }
                          agentIdentityResourceId: {
                            type: 'string'
                          }
                          identityType: {
                            type: 'string'
                          }
                          userAssignedIdentities: {
                            type: 'object'
                          }
                        }
                        resources: [
                          {
                            type: kind.type
                            apiVersion: '2019-07-01'
                            name: '[parameters(\'name\')]'
                            location: '[parameters(\'location\')]'
                            identity: {
                              type: '[if(contains(parameters(\'identityType\'), \'SystemAssigned\'), \'SystemAssigned,UserAssigned\', \'UserAssigned\')]'
                              userAssignedIdentities: '[union(parameters(\'userAssignedIdentities\'), createObject(parameters(\'agentIdentityResourceId\'), createObject()))]'
                            }
                          }
                        ]
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
}]

module assignments 'policy-assignment.bicep' = [for (kind, i) in kinds: {
  name: 'se-bridge-identity-${kind.key}-assignment'
  scope: resourceGroup(assignmentResourceGroup)
  params: {
    name: 'se-bridge-identity-${kind.key}'
    displayName: definitions[i].properties.displayName
    definitionId: definitions[i].id
    location: location
    parameters: {
      effect: {
        value: effect
      }
      agentIdentityResourceId: {
        value: agentIdentityResourceId
      }
    }
    roleDefinitionId: virtualMachineContributor
    purpose: 'attaches the agents\' identity to the VMs and scale sets of this group'
  }
}]

// Managed Identity Operator on the agents' identity only, for each assignment's identity.
module identityOperators 'identity-operator.bicep' = [for (kind, i) in kinds: {
  name: 'se-bridge-identity-${kind.key}-operator'
  scope: resourceGroup(identityParts[2], identityParts[4])
  params: {
    identityName: identityParts[8]
    principalId: assignments[i].outputs.principalId
    roleDefinitionId: managedIdentityOperator
  }
}]

@description('The policy definitions, VMs then scale sets (assign them elsewhere too: a management group covers a fleet).')
output definitionIds array = [for (kind, i) in kinds: definitions[i].id]
