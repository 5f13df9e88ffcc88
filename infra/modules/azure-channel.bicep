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

@description('System topic name (3-128 characters: letters, digits, -).')
param systemTopicName string

@description('Principal reading the hub (the fleet approver\'s identity runs the azure-channel service).')
param readerPrincipalId string

@description('Tags of every resource.')
param tags object

var topicType = 'Microsoft.ResourceNotifications.MaintenanceResources'
var eventType = 'Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted'
var roles = {
  eventHubsDataSender: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '2b629674-e913-4c01-ae53-ef4638d8f975')
  eventHubsDataReceiver: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde')
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

// The subscription's maintenance resources: location global, source the subscription itself.
resource topic 'Microsoft.EventGrid/systemTopics@2025-02-15' = {
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

// The topic's identity may send to this one hub, nothing else (no SAS key anywhere).
resource topicSends 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hub.id, topicType, roles.eventHubsDataSender)
  scope: hub
  properties: {
    principalId: topic.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: roles.eventHubsDataSender
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
  parent: topic
  name: 'se-bridge-to-event-hub'
  dependsOn: [
    topicSends
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
  }
}

@description('The hub\'s resource id.')
output hubId string = hub.id

@description('The system topic\'s resource id.')
output systemTopicId string = topic.id
