// Role assignments, least privilege: each identity gets data-plane roles on the single hub or container
// it uses, never on the namespace or the account (a role on the namespace would reach every hub).
//
//   agent     Data Sender   on the records hub      (publish records and approval audit records)
//             Data Receiver on the decisions hub    (its local approver reads decisions)
//             Blob Data Reader on `artifacts`       (the VM extension downloads the wheel with it;
//                                                    the signer Function its package, as logicApp)
//   approver  Data Receiver on the decisions hub    (fleet mode: decisions for every VM)
//             Data Receiver on the records hub      (learns each agent's relay address from records)
//             Data Sender   on the records hub      (its own audit records)
//             Blob Data Contributor on `checkpoints` (Event Hubs checkpoints and partition ownership)
//   logicApp  Data Sender   on the decisions hub    (publishes decisions)
//             Data Receiver on the records hub      (only with the Event Hubs trigger)

@description('Event Hubs namespace name.')
param namespaceName string

@description('Records hub name.')
param eventsHubName string

@description('Decisions hub name.')
param decisionsHubName string

@description('Storage account of checkpoints and artifacts.')
param storageAccountName string

@description('Container of the approvers\' checkpoints.')
param checkpointsContainerName string

@description('Container of the install artifacts.')
param artifactsContainerName string

@description('Principal id of the agents\' identity.')
param agentPrincipalId string

@description('Principal id of the fleet approver\'s identity.')
param approverPrincipalId string

@description('Principal id of se-bridge azure-channel\'s identity (empty: not deployed). It reads the records hub (reconciliation) and publishes to it, and checkpoints its reading of Azure\'s hub.')
param azureChannelPrincipalId string = ''

@description('Principal id of the Logic App identity; empty: no Logic App.')
param logicAppPrincipalId string

@description('true when the Logic App reads the records hub (Event Hubs trigger).')
param logicAppReadsEvents bool

var roles = {
  eventHubsDataSender: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '2b629674-e913-4c01-ae53-ef4638d8f975')
  eventHubsDataReceiver: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde')
  blobDataContributor: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'ba92f5b4-2d11-453d-a403-e96b0029c9fe')
  blobDataReader: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '2a2b9908-6ea1-4ae2-8e65-a410df84e7d1')
}

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource eventsHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' existing = {
  parent: namespace
  name: eventsHubName
}

resource decisionsHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' existing = {
  parent: namespace
  name: decisionsHubName
}

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource checkpoints 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: checkpointsContainerName
}

resource artifacts 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: artifactsContainerName
}

resource agentSendsRecords 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(eventsHub.id, agentPrincipalId, roles.eventHubsDataSender)
  scope: eventsHub
  properties: {
    principalId: agentPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataSender
    description: 'se-bridge agents publish records'
  }
}

resource agentReadsDecisions 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(decisionsHub.id, agentPrincipalId, roles.eventHubsDataReceiver)
  scope: decisionsHub
  properties: {
    principalId: agentPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataReceiver
    description: 'se-bridge local approvers read decisions'
  }
}

resource agentReadsArtifacts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(artifacts.id, agentPrincipalId, roles.blobDataReader)
  scope: artifacts
  properties: {
    principalId: agentPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.blobDataReader
    description: 'se-bridge VM extension downloads the installer and the wheel'
  }
}

resource approverReadsArtifacts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(artifacts.id, approverPrincipalId, roles.blobDataReader)
  scope: artifacts
  properties: {
    principalId: approverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.blobDataReader
    description: 'se-bridge central services (infra/modules/central.bicep) download the wheel'
  }
}

resource logicAppReadsSignerPackage 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(logicAppPrincipalId)) {
  name: guid(artifacts.id, logicAppPrincipalId, roles.blobDataReader)
  scope: artifacts
  properties: {
    principalId: logicAppPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.blobDataReader
    description: 'se-bridge signer Function runs from its package in the artifacts container'
  }
}

resource approverReadsDecisions 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(decisionsHub.id, approverPrincipalId, roles.eventHubsDataReceiver)
  scope: decisionsHub
  properties: {
    principalId: approverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataReceiver
    description: 'se-bridge fleet approver reads decisions'
  }
}

resource approverReadsRecords 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(eventsHub.id, approverPrincipalId, roles.eventHubsDataReceiver)
  scope: eventsHub
  properties: {
    principalId: approverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataReceiver
    description: 'se-bridge fleet approver learns relay addresses from records'
  }
}

resource approverSendsAudit 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(eventsHub.id, approverPrincipalId, roles.eventHubsDataSender)
  scope: eventsHub
  properties: {
    principalId: approverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataSender
    description: 'se-bridge fleet approver publishes audit records'
  }
}

resource approverCheckpoints 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(checkpoints.id, approverPrincipalId, roles.blobDataContributor)
  scope: checkpoints
  properties: {
    principalId: approverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.blobDataContributor
    description: 'se-bridge fleet approver checkpoints'
  }
}

resource channelReadsRecords 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(azureChannelPrincipalId)) {
  name: guid(eventsHub.id, azureChannelPrincipalId, roles.eventHubsDataReceiver)
  scope: eventsHub
  properties: {
    principalId: azureChannelPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataReceiver
    description: 'se-bridge azure-channel reconciles Azure\'s events with the agents\' records'
  }
}

resource channelPublishes 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(azureChannelPrincipalId)) {
  name: guid(eventsHub.id, azureChannelPrincipalId, roles.eventHubsDataSender)
  scope: eventsHub
  properties: {
    principalId: azureChannelPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataSender
    description: 'se-bridge azure-channel publishes Azure\'s events and its findings'
  }
}

resource channelCheckpoints 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(azureChannelPrincipalId)) {
  name: guid(checkpoints.id, azureChannelPrincipalId, roles.blobDataContributor)
  scope: checkpoints
  properties: {
    principalId: azureChannelPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.blobDataContributor
    description: 'se-bridge azure-channel checkpoints its reading of Azure\'s hub'
  }
}

resource logicAppSendsDecisions 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(logicAppPrincipalId)) {
  name: guid(decisionsHub.id, logicAppPrincipalId, roles.eventHubsDataSender)
  scope: decisionsHub
  properties: {
    principalId: logicAppPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataSender
    description: 'se-bridge Logic App publishes decisions'
  }
}

resource logicAppReadsRecords 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(logicAppPrincipalId) && logicAppReadsEvents) {
  name: guid(eventsHub.id, logicAppPrincipalId, roles.eventHubsDataReceiver)
  scope: eventsHub
  properties: {
    principalId: logicAppPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataReceiver
    description: 'se-bridge Logic App reads records (Event Hubs trigger)'
  }
}
