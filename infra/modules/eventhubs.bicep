// Event Hubs namespace with the two hubs of the bridge: records (agents -> dashboards, Logic Apps,
// ADX, a fleet approver) and decisions (dashboards, Logic Apps, engineers -> approvers).
// Entra ID only by default: the agents and approvers hold a managed identity, never a SAS key.

@description('Azure region.')
param location string

@description('Namespace name (6-50 characters, globally unique).')
param namespaceName string

@description('Standard or Premium.')
param skuName string

@description('Throughput units (Standard) or processing units (Premium).')
param capacity int

@description('true: SAS keys are refused, every client authenticates with Entra ID.')
param disableLocalAuth bool

@description('Enabled, or Disabled when clients come through private endpoints.')
param publicNetworkAccess string

@description('Hub the agents publish records to.')
param eventsHubName string

@description('Hub the decisions are published to.')
param decisionsHubName string

@description('Partitions of the records hub (records are keyed by vmId, so per-VM order holds).')
param eventsPartitionCount int

@description('Partitions of the decisions hub.')
param decisionsPartitionCount int

@description('Days a message is kept (Standard: at most 7).')
param retentionDays int

@description('Consumer groups on the records hub (one per independent reader).')
param eventsConsumerGroups array

@description('Consumer groups on the decisions hub.')
param decisionsConsumerGroups array

@description('Subnets (resource ids) admitted by the network rules; empty with public access Enabled: no rules.')
param allowedSubnetIds array

@description('Log Analytics workspace (resource id) for the diagnostic settings; empty: none.')
param logAnalyticsWorkspaceId string

@description('Subnet (resource id) of a private endpoint; empty: none.')
param privateEndpointSubnetId string

@description('Private DNS zone (resource id) the private endpoint registers in; empty: none.')
param privateDnsZoneId string

@description('Tags of every resource.')
param tags object

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' = {
  name: namespaceName
  location: location
  tags: tags
  sku: {
    name: skuName
    tier: skuName
    capacity: capacity
  }
  properties: {
    minimumTlsVersion: '1.2'
    disableLocalAuth: disableLocalAuth
    kafkaEnabled: true
    publicNetworkAccess: publicNetworkAccess
    isAutoInflateEnabled: false
  }
}

resource eventsHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: namespace
  name: eventsHubName
  properties: {
    partitionCount: eventsPartitionCount
    messageRetentionInDays: retentionDays
  }
}

resource decisionsHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: namespace
  name: decisionsHubName
  properties: {
    partitionCount: decisionsPartitionCount
    messageRetentionInDays: retentionDays
  }
}

resource eventsGroups 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2024-01-01' = [for group in eventsConsumerGroups: {
  parent: eventsHub
  name: group
  properties: {
    userMetadata: 'se-bridge reader of ${eventsHubName}'
  }
}]

resource decisionsGroups 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2024-01-01' = [for group in decisionsConsumerGroups: {
  parent: decisionsHub
  name: group
  properties: {
    userMetadata: 'se-bridge reader of ${decisionsHubName}'
  }
}]

@description('Namespace resource name.')
output namespaceName string = namespace.name

@description('Host name clients connect to (AMQP 5671, Kafka 9093, HTTPS 443), e.g. ns.servicebus.windows.net.')
output namespaceFqdn string = replace(replace(namespace.properties.serviceBusEndpoint, 'https://', ''), ':443/', '')

@description('Resource id of the records hub (scope of the sender role).')
output eventsHubId string = eventsHub.id

@description('Resource id of the decisions hub.')
output decisionsHubId string = decisionsHub.id

// Network rules: with subnets, only they (and trusted Azure services, e.g. Data Explorer's data
// connection) reach the namespace over its public endpoint; private endpoints are separate.
// Whenever access is restricted (subnets) or public access is off (private endpoints): Event Grid
// delivers Azure's own channel as a trusted service, and without this rule set saying so
// (trustedServiceAccessEnabled) it cannot deliver to a namespace whose public access is Disabled
// (issue 34: the rule set existed only when subnets were given).
resource networkRules 'Microsoft.EventHub/namespaces/networkRuleSets@2024-01-01' = if (!empty(allowedSubnetIds) || publicNetworkAccess == 'Disabled') {
  parent: namespace
  name: 'default'
  properties: {
    defaultAction: 'Deny'
    publicNetworkAccess: publicNetworkAccess
    trustedServiceAccessEnabled: true
    virtualNetworkRules: [for subnetId in allowedSubnetIds: {
      subnet: {
        id: subnetId
      }
      ignoreMissingVnetServiceEndpoint: false
    }]
    ipRules: []
  }
}

// A private endpoint (when a subnet is given) and its DNS registration (when a zone is given).
module privateEndpoint 'private-endpoint.bicep' = if (!empty(privateEndpointSubnetId)) {
  name: '${namespaceName}-pe'
  params: {
    location: location
    name: '${namespaceName}-pe'
    subnetId: privateEndpointSubnetId
    serviceId: namespace.id
    groupId: 'namespace'
    dnsZoneId: privateDnsZoneId
    tags: tags
  }
}

// Logs and metrics to Log Analytics (when a workspace is given).
resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(logAnalyticsWorkspaceId)) {
  name: 'se-bridge-to-log-analytics'
  scope: namespace
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}
