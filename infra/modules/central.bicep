// The central services of a fleet (issue 34): a fleet approver pair in one consumer group and Azure's
// channel, on a small Flexible scale set (two instances by default), each instance running both from
// one configuration the template renders (no hand edits) with deploy/linux/install.sh --role central.
//
// Why VMs and not containers, when the console is a Container App: what these services decide with
// is on disk and must survive a restart and kill -9 (the approver's decision store and fleet pins, the
// outboxes of audit records and of Azure's records, the channel's event journal), each instance in its
// own state directory under a lock. That is what the tests exercise, on local file systems; a Container
// App keeps such files either on storage that goes with the replica or on Azure Files (SMB, whose lock
// and fsync semantics are not what was tested). A managed disk is. The console keeps nothing that
// decides: it rebuilds its view from the stream, so it stays a container.
//
// What each instance gets: the installer (embedded, as deploy/linux/cloud-init.yaml does), the settings
// (`output settings`, no secret in them), the decision keys' public halves, and the wheel from the
// artifacts container read with the services' identity. The relay key (shared with the agents) and
// Azure's channel's signing key are Key Vault secrets of this module's vault, read at start with the
// same identity (Key Vault Secrets User on those two secrets only).

@description('Region of the scale set and its vault.')
param location string

@description('Name of the Flexible scale set.')
param scaleSetName string

@description('Name of the Key Vault holding the relay key and Azure\'s channel\'s signing key (3-24 characters).')
@minLength(3)
@maxLength(24)
param keyVaultName string

@description('Instances (each runs a fleet approver and Azure\'s channel; two for a pair that survives one).')
@minValue(1)
@maxValue(5)
param instanceCount int = 2

@description('VM size of an instance.')
param vmSize string = 'Standard_B2s'

@description('Subnet of the instances: they reach the agents\' relay on port 8710 and Azure\'s endpoints.')
param subnetId string

@description('Administrator user name (SSH key only; no password).')
param adminUsername string = 'sebridge'

@description('SSH public key of the administrator.')
param adminPublicKey string

@description('The fleet approvers\' user-assigned identity: resource id, client id and principal id (it also downloads the wheel).')
param identity object

@description('Azure\'s channel\'s own identity ({} without Azure\'s channel): resource id, client id, principal id.')
param channelIdentity object = {}

@description('HTTPS URL of the wheel in the artifacts container (read with the identity).')
param wheelUrl string

@description('The fleet approver\'s --source (the decisions hub, its consumer group and checkpoint store).')
param decisionsSpec string

@description('The fleet approver\'s --events-source (the records hub, every partition).')
param approverEventsSpec string

@description('Where the approvers\' audit records and Azure\'s channel\'s records go (the records hub).')
param recordsSinkSpec string

@description('Azure\'s channel\'s --source (the hub Event Grid delivers to); empty: no Azure\'s channel.')
param azureChannelSourceSpec string = ''

@description('Azure\'s channel\'s --events-source (the records hub, its own consumer group).')
param azureChannelEventsSpec string = ''

@description('Where Azure\'s channel publishes (the records hub, with its own identity).')
param azureChannelSinkSpec string = ''

@description('The keys decisions are signed with, [{id, publicKey}]: the public half (PEM) of each (the console\'s, the Logic App signer\'s, a person\'s for se-bridge decide). Not secrets: written to each instance, verified by the approvers.')
@minLength(1)
param decisionKeys array

@description('The relay key the agents verify the fleet approvers\' requests with (at least 32 bytes).')
@secure()
@minLength(32)
param relayKey string

@description('Azure\'s channel\'s record signing key (at least 32 bytes); the approvers verify with it too.')
@secure()
@minLength(32)
param azureSignKey string

@description('Resource groups the approvers may acknowledge in through ARM (--arm fallback); empty: relay only.')
param armScopes array = []

@description('Tags of every resource.')
param tags object

var withChannel = !empty(azureChannelSourceSpec)
var keyVaultSecretsUser = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '4633458b-17de-408a-b874-0445c86b69e6')

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_109: no firewall rules: the instances reach the vault over the network they are given; access is Entra ID RBAC only (one identity, two secrets)
  // checkov:skip=CKV_AZURE_189: public network access stays on for the same reason; RBAC, purge protection and soft delete guard the secrets
  name: keyVaultName
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
  }
}

resource relaySecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  // checkov:skip=CKV_AZURE_41: the relay key is rotated with the agents' copy, not by expiry
  parent: vault
  name: 'relay-fleet'
  properties: {
    value: relayKey
    contentType: 'text/plain'
  }
}

resource azureSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  // checkov:skip=CKV_AZURE_41: rotated with the readers' copy (the console's --azure-key), not by expiry
  parent: vault
  name: 'azure-channel-sign'
  properties: {
    value: azureSignKey
    contentType: 'text/plain'
  }
}

resource readsRelay 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(relaySecret.id, identity.principalId, keyVaultSecretsUser)
  scope: relaySecret
  properties: {
    principalId: identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: keyVaultSecretsUser
  }
}

// The approvers verify Azure's channel's records with its key; the channel signs with it.
resource readsAzureKey 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(azureSecret.id, identity.principalId, keyVaultSecretsUser)
  scope: azureSecret
  properties: {
    principalId: identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: keyVaultSecretsUser
  }
}

resource channelReadsAzureKey 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (withChannel) {
  name: guid(azureSecret.id, withChannel ? channelIdentity.principalId : 'none', keyVaultSecretsUser)
  scope: azureSecret
  properties: {
    principalId: withChannel ? channelIdentity.principalId : ''
    principalType: 'ServicePrincipal'
    roleDefinitionId: keyVaultSecretsUser
  }
}

var relayKeyRef = 'fleet=${vault.properties.vaultUri}secrets/relay-fleet?client_id=${identity.clientId}'
var azureKeyRef = 'azure=${vault.properties.vaultUri}secrets/azure-channel-sign?client_id=${identity.clientId}'
var channelSignRef = withChannel ? 'azure=${vault.properties.vaultUri}secrets/azure-channel-sign?client_id=${channelIdentity.clientId}' : ''
var keysDir = '/etc/se-bridge/keys'

// The configuration install.sh --role central renders into /etc/se-bridge/config.toml (checked, and
// the services started from it, by tests/integration/test_deploy_paths.py).
var approverSettings = union({
  mode: 'fleet'
  source: decisionsSpec
  events_source: [
    approverEventsSpec
  ]
  key: [for k in decisionKeys: '${k.id}=${keysDir}/${k.id}.pub']
  relay_key: [
    relayKeyRef
  ]
  sink: [
    recordsSinkSpec
  ]
  // /healthz and /metrics for the instance's own checks (the installer probes it on loopback)
  listen: '127.0.0.1:8711'
}, withChannel ? {
  azure_key: [
    azureKeyRef
  ]
} : {}, empty(armScopes) ? {} : {
  arm: 'fallback'
  arm_client_id: identity.clientId
  arm_scope: armScopes
})
var channelSettings = withChannel ? {
  source: [
    azureChannelSourceSpec
  ]
  events_source: empty(azureChannelEventsSpec) ? [] : [
    azureChannelEventsSpec
  ]
  sink: [
    azureChannelSinkSpec
  ]
  sign_key: channelSignRef
  listen: '127.0.0.1:8730'
} : {}
var settings = union({
  approver: approverSettings
}, empty(channelSettings) ? {} : {
  azure_channel: channelSettings
})

// One write_files entry per decision key (its public half, PEM).
var keyFiles = [for k in decisionKeys: '  - path: ${keysDir}/${k.id}.pub\n    owner: root:root\n    permissions: "0644"\n    encoding: b64\n    content: ${base64(k.publicKey)}']
var cloudInit = join(concat([
  '#cloud-config'
  '# se-bridge central services (infra/modules/central.bicep): no secret here (custom data can be read back).'
  'write_files:'
  '  - path: /usr/local/sbin/se-bridge-install'
  '    owner: root:root'
  '    permissions: "0755"'
  '    encoding: b64'
  '    content: ${base64(loadTextContent('../../deploy/linux/install.sh'))}'
  '  - path: /etc/se-bridge/install/settings.json'
  '    owner: root:root'
  '    permissions: "0600"'
  '    encoding: b64'
  '    content: ${base64(string(settings))}'
], keyFiles, [
  'runcmd:'
  '  - [/usr/local/sbin/se-bridge-install, --role, central, --settings, /etc/se-bridge/install/settings.json, --extras, "eventhubs,keyvault,arm", --wheel, "${wheelUrl}", --download-identity, "${identity.clientId}"]'
  ''
]), '\n')

resource scaleSet 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' = {
  // checkov:skip=CKV_AZURE_95: no automatic OS image upgrade: it reimages the OS disk, where each instance keeps what decides (decision store, outboxes, journals); Ubuntu's unattended-upgrades patches in place
  // checkov:skip=CKV_AZURE_97: encryption at host is a subscription feature (Microsoft.Compute/EncryptionAtHost) an operator turns on; the managed disks are encrypted at rest by the platform
  name: scaleSetName
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    // Each service its own: the approvers' (which also fetches the wheel), and Azure's channel's.
    userAssignedIdentities: withChannel ? {
      '${identity.id}': {}
      '${channelIdentity.id}': {}
    } : {
      '${identity.id}': {}
    }
  }
  sku: {
    name: vmSize
    capacity: instanceCount
  }
  properties: {
    orchestrationMode: 'Flexible'
    platformFaultDomainCount: 1
    singlePlacementGroup: false
    virtualMachineProfile: {
      osProfile: {
        computerNamePrefix: take(scaleSetName, 9)
        adminUsername: adminUsername
        customData: base64(cloudInit)
        linuxConfiguration: {
          disablePasswordAuthentication: true
          ssh: {
            publicKeys: [
              {
                path: '/home/${adminUsername}/.ssh/authorized_keys'
                keyData: adminPublicKey
              }
            ]
          }
          provisionVMAgent: true
        }
      }
      storageProfile: {
        imageReference: {
          publisher: 'Canonical'
          offer: 'ubuntu-24_04-lts'
          sku: 'server'
          version: 'latest'
        }
        osDisk: {
          createOption: 'FromImage'
          managedDisk: {
            storageAccountType: 'StandardSSD_LRS'
          }
        }
      }
      networkProfile: {
        networkApiVersion: '2020-11-01'
        networkInterfaceConfigurations: [
          {
            name: 'nic'
            properties: {
              primary: true
              ipConfigurations: [
                {
                  name: 'ip'
                  properties: {
                    subnet: {
                      id: subnetId
                    }
                  }
                }
              ]
            }
          }
        ]
      }
      diagnosticsProfile: {
        bootDiagnostics: {
          enabled: true
        }
      }
    }
  }
  dependsOn: [
    readsRelay
    readsAzureKey
    channelReadsAzureKey
  ]
}

@description('The settings each instance renders (no secret: keys are Key Vault references and a public key file).')
output settings object = settings

@description('The scale set\'s resource id.')
output scaleSetId string = scaleSet.id
