// One assignment of a se-bridge policy (the VM Application or the agents' identity) on one resource
// group, with the managed identity its remediation tasks run as, and that identity's role on the same
// group only (a role elsewhere, e.g. on the agents' identity, is granted by the caller with the
// principalId output).
targetScope = 'resourceGroup'

@description('Assignment name (az policy remediation create --policy-assignment).')
param name string

@description('Display name.')
param displayName string

@description('Resource id of the policy definition.')
param definitionId string

@description('Region of the assignment\'s managed identity.')
param location string

@description('The definition\'s parameters, as policy assignment parameter values.')
param parameters object

@description('Role the remediation needs on the VMs and scale sets (Virtual Machine Contributor).')
param roleDefinitionId string

@description('What the remediation does, for the role assignment\'s description.')
param purpose string

resource assignment 'Microsoft.Authorization/policyAssignments@2024-04-01' = {
  name: name
  location: location
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    displayName: displayName
    policyDefinitionId: definitionId
    parameters: parameters
  }
}

resource remediationRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, assignment.id, roleDefinitionId)
  properties: {
    principalId: assignment.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionId)
    description: '${name} remediation: ${purpose}'
  }
}

@description('Resource id of the assignment (for az policy remediation create).')
output assignmentId string = assignment.id

@description('Principal id of the assignment\'s identity (for roles outside this group).')
output principalId string = assignment.identity.principalId
