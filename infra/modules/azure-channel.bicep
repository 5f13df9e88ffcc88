// Azure's own Scheduled Events channel into the bridge's namespace (issue 25, docs/azure-channel.md):
// an Event Grid system topic of the subscription's MaintenanceResources, an event subscription that
// delivers its ScheduledEventEmitted events with the topic's own managed identity to a dedicated hub,
// and the consumer group `se-bridge azure-channel` reads with. Azure publishes there only for the
// VMs, scale sets and availability sets whose scheduledEventsPolicy enables
// eventGridAndResourceGraph (preview: feature Microsoft.Compute/SendScheduledEventsPolicy;
// deploy/enable-scheduled-events-policy.sh or modules/scheduled-events-policy.bicep).

@description('The bridge\'s Event Hubs namespace (modules/eventhubs.bicep).')
param namespaceName string

@description('Hub Event Grid delivers Azure\'s scheduled events to.')
param hubName string = 'se-azure-events'

@description('Partitions of that hub (Standard: at most 32).')
@minValue(1)
@maxValue(32)
param partitionCount int = 2

@description('Days a message is kept (Standard: at most 7).')
param retentionDays int

@description('Consumer group of the azure-channel service (shared by its instances through the checkpoint store).')
param consumerGroup string = 'se-bridge-azure-channel'

@description('System topic name (3-128 characters: letters, digits, -) when this deployment creates it.')
param systemTopicName string

@description('An existing system topic of this subscription\'s MaintenanceResources to subscribe to (in this resource group; with a system-assigned identity). Azure allows one system topic per source: a second deployment in a subscription, or a subscription where the topic was made by hand (as Microsoft\'s page on scheduled events in Event Grid shows), must name it here. Empty: create one.')
param existingSystemTopicName string = ''

@description('Storage account (this deployment\'s own) that keeps deliveries Event Grid could not make (the dead letters).')
param deadLetterAccountName string

@description('Its container for them (created here).')
param deadLetterContainerName string = 'se-azure-deadletters'

@description('Principal reading the hub (the fleet approver\'s identity runs the azure-channel service).')
param readerPrincipalId string

@description('Tags of every resource.')
param tags object

var topicType = 'Microsoft.ResourceNotifications.MaintenanceResources'
var createTopic = empty(existingSystemTopicName)
var eventType = 'Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted'
var roles = {
  eventHubsDataSender: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '2b629674-e913-4c01-ae53-ef4638d8f975')
  eventHubsDataReceiver: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde')
  storageBlobDataContributor: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'ba92f5b4-2d11-453d-a403-e96b0029c9fe')
}

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: namespace
  name: hubName
  properties: {
    partitionCount: partitionCount
    messageRetentionInDays: retentionDays
  }
}

resource group 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2024-01-01' = {
  parent: hub
  name: consumerGroup
}

// The subscription's maintenance resources: location global, source the subscription itself. Only
// one system topic per source is allowed (issue 34): created here unless one exists already.
resource newTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = if (createTopic) {
  name: systemTopicName
  location: 'global'
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: subscription().id
    topicType: topicType
  }
}

resource existingTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' existing = if (!createTopic) {
  name: existingSystemTopicName
}

var topicPrincipalId = createTopic ? newTopic.identity.principalId : existingTopic.identity.principalId

// The topic's identity may send to this one hub, nothing else (no SAS key anywhere).
resource topicSends 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hub.id, topicType, roles.eventHubsDataSender)
  scope: hub
  properties: {
    principalId: topicPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataSender
  }
}

// Completed and Canceled exist only on this channel: a delivery Event Grid gives up on (30 attempts,
// 24 h) is kept in this container, written with the topic's identity (issue 34), not lost.
resource deadLetterAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: deadLetterAccountName
}

resource deadLetterBlobs 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: deadLetterAccount
  name: 'default'
}

resource deadLetters 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: deadLetterBlobs
  name: deadLetterContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource topicDeadLetters 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(deadLetters.id, topicType, roles.storageBlobDataContributor)
  scope: deadLetters
  properties: {
    principalId: topicPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.storageBlobDataContributor
  }
}

resource readerReceives 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hub.id, readerPrincipalId, roles.eventHubsDataReceiver)
  scope: hub
  properties: {
    principalId: readerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataReceiver
  }
}

resource toHub 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {
  #disable-next-line use-parent-property
  name: '${createTopic ? systemTopicName : existingSystemTopicName}/se-bridge-to-event-hub'
  dependsOn: [
    newTopic
    topicSends
    topicDeadLetters
  ]
  properties: {
    eventDeliverySchema: 'EventGridSchema'
    deliveryWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      destination: {
        endpointType: 'EventHub'
        properties: {
          resourceId: hub.id
        }
      }
    }
    filter: {
      includedEventTypes: [
        eventType
      ]
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: deadLetterAccount.id
          blobContainerName: deadLetters.name
        }
      }
    }
  }
}

@description('The hub\'s resource id.')
output hubId string = hub.id

@description('The system topic\'s resource id (the one created, or the one named).')
output systemTopicId string = createTopic ? newTopic.id : existingTopic.id
