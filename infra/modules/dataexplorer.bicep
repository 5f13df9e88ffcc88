// Azure Data Explorer for the ops dashboard: a cluster, a database, the table + JSON ingestion mapping
// of the records (../adx/setup.kql, run as a database script), and an Event Hubs data connection that
// ingests the records hub with the cluster's own managed identity (Data Receiver on that hub only).
// The dashboard queries are in ../adx/dashboard.kql.

@description('Azure region.')
param location string

@description('Cluster name (4-22 lower-case letters and digits).')
param clusterName string

@description('Cluster SKU, e.g. Dev(No SLA)_Standard_E2a_v4 (tier Basic) for a small fleet.')
param skuName string

@description('Basic (dev SKU) or Standard.')
param skuTier string

@description('Database name.')
param databaseName string

@description('Event Hubs namespace name.')
param namespaceName string

@description('Records hub name.')
param eventsHubName string

@description('Consumer group of the data connection on the records hub.')
param consumerGroup string

@description('Object id of an Entra ID group that may query the database; empty: none.')
param viewerGroupObjectId string

@description('Enabled, or Disabled when clients come through private endpoints.')
param publicNetworkAccess string

@description('Log Analytics workspace (resource id) for the diagnostic settings; empty: none.')
param logAnalyticsWorkspaceId string

@description('Subnet (resource id) of a private endpoint; empty: none.')
param privateEndpointSubnetId string

@description('Private DNS zone (resource id) the private endpoint registers in; empty: none.')
param privateDnsZoneId string

@description('Tags of every resource.')
param tags object

var eventHubsDataReceiver = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde')

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource eventsHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' existing = {
  parent: namespace
  name: eventsHubName
}

resource cluster 'Microsoft.Kusto/clusters@2023-08-15' = {
  name: clusterName
  location: location
  tags: tags
  sku: {
    name: skuName
    tier: skuTier
    capacity: 1
  }
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    enableDiskEncryption: true
    enableDoubleEncryption: true
    enableStreamingIngest: false
    enablePurge: false
    enableAutoStop: true
    publicNetworkAccess: publicNetworkAccess
    trustedExternalTenants: []
  }
}

resource database 'Microsoft.Kusto/clusters/databases@2023-08-15' = {
  parent: cluster
  name: databaseName
  location: location
  kind: 'ReadWrite'
  properties: {
    softDeletePeriod: 'P365D'
    hotCachePeriod: 'P31D'
  }
}

resource schema 'Microsoft.Kusto/clusters/databases/scripts@2023-08-15' = {
  parent: database
  name: 'se-bridge-schema'
  properties: {
    scriptContent: loadTextContent('../adx/setup.kql')
    continueOnErrors: false
  }
}

resource clusterReadsRecords 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(eventsHub.id, cluster.id, eventHubsDataReceiver)
  scope: eventsHub
  properties: {
    principalId: cluster.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: eventHubsDataReceiver
    description: 'Azure Data Explorer ingests se-bridge records'
  }
}

resource records 'Microsoft.Kusto/clusters/databases/dataConnections@2023-08-15' = {
  parent: database
  name: 'se-bridge-records'
  location: location
  kind: 'EventHub'
  properties: {
    eventHubResourceId: eventsHub.id
    consumerGroup: consumerGroup
    tableName: 'SeBridgeRecords'
    mappingRuleName: 'SeBridgeRecordsMapping'
    dataFormat: 'MULTIJSON'
    compression: 'None'
    databaseRouting: 'Single'
    managedIdentityResourceId: cluster.id
  }
  dependsOn: [
    schema
    clusterReadsRecords
  ]
}

resource viewers 'Microsoft.Kusto/clusters/databases/principalAssignments@2023-08-15' = if (!empty(viewerGroupObjectId)) {
  parent: database
  name: 'se-bridge-viewers'
  properties: {
    principalId: viewerGroupObjectId
    principalType: 'Group'
    role: 'Viewer'
    tenantId: tenant().tenantId
  }
}

@description('Cluster query URI, e.g. https://name.region.kusto.windows.net.')
output clusterUri string = cluster.properties.uri

@description('Database name.')
output databaseName string = database.name

// A private endpoint (when a subnet is given) and its DNS registration (when a zone is given).
module privateEndpoint 'private-endpoint.bicep' = if (!empty(privateEndpointSubnetId)) {
  name: '${clusterName}-pe'
  params: {
    location: location
    name: '${clusterName}-pe'
    subnetId: privateEndpointSubnetId
    serviceId: cluster.id
    groupId: 'cluster'
    dnsZoneId: privateDnsZoneId
    tags: tags
  }
}

// Logs and metrics to Log Analytics (when a workspace is given).
resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(logAnalyticsWorkspaceId)) {
  name: 'se-bridge-to-log-analytics'
  scope: cluster
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
