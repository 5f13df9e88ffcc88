// A private endpoint for one service (Event Hubs namespace, storage blob, Data Explorer cluster) and,
// when a zone is given, its registration in that private DNS zone. Used by the modules of those
// services when main.bicep's privateEndpointSubnetId is set.

@description('Azure region.')
param location string

@description('Name of the private endpoint.')
param name string

@description('Subnet (resource id) the endpoint gets its address in.')
param subnetId string

@description('Resource id of the service the endpoint connects to.')
param serviceId string

@description('The service\'s sub-resource: namespace (Event Hubs), blob (storage), cluster (Data Explorer).')
param groupId string

@description('Private DNS zone (resource id) to register in; empty: none (DNS is managed elsewhere).')
param dnsZoneId string

@description('Tags of every resource.')
param tags object

resource endpoint 'Microsoft.Network/privateEndpoints@2023-11-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    subnet: {
      id: subnetId
    }
    privateLinkServiceConnections: [
      {
        name: '${name}-${groupId}'
        properties: {
          privateLinkServiceId: serviceId
          groupIds: [
            groupId
          ]
        }
      }
    ]
  }
}

resource dnsZoneGroup 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2023-11-01' = if (!empty(dnsZoneId)) {
  parent: endpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: groupId
        properties: {
          privateDnsZoneId: dnsZoneId
        }
      }
    ]
  }
}

@description('Resource id of the private endpoint.')
output id string = endpoint.id
