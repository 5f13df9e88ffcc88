// The assignment of the se-bridge-install policy on one resource group, with the managed identity its
// remediation deployments run as, and that identity's role on the same group only.
targetScope = 'resourceGroup'

@description('Resource id of the policy definition.')
param definitionId string

@description('Region of the assignment\'s managed identity.')
param location string

@description('DeployIfNotExists, AuditIfNotExists or Disabled.')
param effect string

@description('Template spec version of deploy/vm-extension.bicep.')
param templateSpecVersionId string

@description('Event Hubs host name.')
param eventHubsNamespaceFqdn string

@description('Client id of the agents\' identity.')
param agentIdentityClientId string

@description('Blob URL of the wheel; empty: the package index.')
param wheelUri string

@description('More [agent] settings.')
param agentSettings object

@description('Role the remediation needs on the VMs (Virtual Machine Contributor).')
param roleDefinitionId string

resource assignment 'Microsoft.Authorization/policyAssignments@2024-04-01' = {
  name: 'se-bridge-install'
  location: location
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    displayName: 'Install the Scheduled Events bridge on tagged Linux VMs'
    policyDefinitionId: definitionId
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
  }
}

resource remediationRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, assignment.id, roleDefinitionId)
  properties: {
    principalId: assignment.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionId)
    description: 'se-bridge-install remediation creates Run Commands on the VMs of this group'
  }
}

@description('Resource id of the assignment (for az policy remediation create).')
output assignmentId string = assignment.id
