// User-assigned managed identities. User-assigned (not system-assigned) so that one identity serves a
// whole fleet, exists before the VMs, and keeps its role assignments when VMs come and go.

@description('Azure region.')
param location string

@description('Identity of the agents (and of their local approvers) on every VM.')
param agentIdentityName string

@description('Identity of a fleet approver (one process serving many VMs).')
param approverIdentityName string

@description('Identity of the example Logic App; empty: none.')
param logicAppIdentityName string

@description('Identity of se-bridge azure-channel (its own: it reads Azure\'s channel and signs what it publishes, nothing of the approvers\'); empty: none.')
param azureChannelIdentityName string = ''

@description('Tags of every resource.')
param tags object

resource agent 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: agentIdentityName
  location: location
  tags: tags
}

resource approver 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: approverIdentityName
  location: location
  tags: tags
}

resource logicApp 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = if (!empty(logicAppIdentityName)) {
  name: empty(logicAppIdentityName) ? 'unused' : logicAppIdentityName
  location: location
  tags: tags
}

resource azureChannel 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = if (!empty(azureChannelIdentityName)) {
  name: empty(azureChannelIdentityName) ? 'unused-azure-channel' : azureChannelIdentityName
  location: location
  tags: tags
}

@description('Agent identity: resource id (to attach to VMs), client id (for the sink spec), principal id (for roles).')
output agent object = {
  id: agent.id
  clientId: agent.properties.clientId
  principalId: agent.properties.principalId
}

@description('Fleet approver identity.')
output approver object = {
  id: approver.id
  clientId: approver.properties.clientId
  principalId: approver.properties.principalId
}

@description('Logic App identity (empty values when not created).')
output logicApp object = {
  id: empty(logicAppIdentityName) ? '' : logicApp.id
  clientId: empty(logicAppIdentityName) ? '' : logicApp.properties.clientId
  principalId: empty(logicAppIdentityName) ? '' : logicApp.properties.principalId
}

@description('Azure\'s channel\'s identity (empty values when not created).')
output azureChannel object = {
  id: empty(azureChannelIdentityName) ? '' : azureChannel.id
  clientId: empty(azureChannelIdentityName) ? '' : azureChannel.properties.clientId
  principalId: empty(azureChannelIdentityName) ? '' : azureChannel.properties.principalId
}
