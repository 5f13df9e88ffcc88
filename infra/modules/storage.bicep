// Storage for the approvers' Event Hubs checkpoints (container `checkpoints`) and for the install
// artifacts the VM extension downloads with the agents' managed identity (container `artifacts`).
// Entra ID only: shared keys, anonymous blob access and TLS < 1.2 are all refused.

@description('Azure region.')
param location string

@description('Storage account name (3-24 lower-case letters and digits, globally unique).')
param accountName string

@description('Replication, e.g. Standard_LRS, or Standard_ZRS where the region has zones.')
param skuName string

@description('Enabled, or Disabled when clients come through private endpoints.')
param publicNetworkAccess string

@description('Allow, or Deny to admit only the subnets below and trusted Azure services.')
param networkDefaultAction string

@description('Subnet resource ids admitted when networkDefaultAction is Deny (service endpoint Microsoft.Storage).')
param allowedSubnetIds array

@description('Container of the approvers\' checkpoints and ownership records.')
param checkpointsContainerName string

@description('Container of the wheel and installer scripts the VM extension downloads.')
param artifactsContainerName string

@description('Log Analytics workspace (resource id) for the diagnostic settings; empty: none.')
param logAnalyticsWorkspaceId string

@description('Subnet (resource id) of a private endpoint; empty: none.')
param privateEndpointSubnetId string

@description('Private DNS zone (resource id) the private endpoint registers in; empty: none.')
param privateDnsZoneId string

@description('Tags of every resource.')
param tags object

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35: the firewall's default action is the networkDefaultAction parameter (Deny admits allowedSubnetIds only); access is Entra ID only either way (shared keys and anonymous reads are off), and the default Allow lets the VM extension fetch artifacts from VMs in any VNet
  // checkov:skip=CKV_AZURE_59: public network access is the publicNetworkAccess parameter (main.bicep default Enabled, so VMs in any VNet and a fleet approver reach the account without private endpoints, which this template does not create); Disabled is supported with private endpoints, and access is Entra ID only either way
  // checkov:skip=CKV_AZURE_206: geo-replication buys nothing here: checkpoints only mean something next to the regional Event Hubs namespace, artifacts can be uploaded again; zone redundancy (Standard_ZRS, the default of main.bicep) covers a zone outage, and skuName accepts Standard_GZRS where policy demands it
  // checkov:skip=CKV_AZURE_43: the name is a module parameter checkov cannot evaluate; main.bicep computes it as take('<lower-case prefix>st<uniqueString>', 24), within the 3-24 lower-case letters and digits rule
  name: accountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: publicNetworkAccess
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: networkDefaultAction
      ipRules: []
      virtualNetworkRules: [for subnetId in allowedSubnetIds: {
        id: subnetId
        action: 'Allow'
      }]
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: {
          enabled: true
          keyType: 'Account'
        }
        file: {
          enabled: true
          keyType: 'Account'
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource checkpoints 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: checkpointsContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource artifacts 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: artifactsContainerName
  properties: {
    publicAccess: 'None'
  }
}

@description('Storage account resource name.')
output accountName string = account.name

@description('Blob endpoint, e.g. https://account.blob.core.windows.net/.')
output blobEndpoint string = account.properties.primaryEndpoints.blob

@description('Container names, for the role assignments.')
output containers object = {
  checkpoints: checkpoints.name
  artifacts: artifacts.name
}

// A private endpoint (when a subnet is given) and its DNS registration (when a zone is given).
module privateEndpoint 'private-endpoint.bicep' = if (!empty(privateEndpointSubnetId)) {
  name: '${accountName}-pe'
  params: {
    location: location
    name: '${accountName}-pe'
    subnetId: privateEndpointSubnetId
    serviceId: account.id
    groupId: 'blob'
    dnsZoneId: privateDnsZoneId
    tags: tags
  }
}

// Logs and metrics to Log Analytics (when a workspace is given).
resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(logAnalyticsWorkspaceId)) {
  name: 'se-bridge-to-log-analytics'
  scope: blobService
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
