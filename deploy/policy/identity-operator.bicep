// Managed Identity Operator on one user-assigned identity (the agents'), for a policy assignment's
// identity: the right to attach that identity to VMs and scale sets, and nothing else.
targetScope = 'resourceGroup'

@description('Name of the user-assigned identity (in this resource group).')
param identityName string

@description('Principal id of the policy assignment\'s identity.')
param principalId string

@description('Role definition id (Managed Identity Operator).')
param roleDefinitionId string

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' existing = {
  name: identityName
}

resource operator 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(identity.id, principalId, roleDefinitionId)
  scope: identity
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionId)
    description: 'a se-bridge identity policy attaches the agents\' identity to tagged VMs and scale sets'
  }
}
