// The example Logic App's signer: an Azure Function (Python, infra/signer/) that signs approval
// decisions with the approvers' own code, and the Key Vault that holds its key (issue 13).
//
// Why: a Consumption workflow's inline code takes at most 1,024 characters and the workflow language
// has no HMAC. The key lives in Key Vault only: the Function's app setting is a Key Vault reference
// the platform resolves with the workflow's user-assigned identity (Key Vault Secrets User on that
// one secret); the workflow calls the Function with its function key, never sees the signing key.
// The Function runs from a package in the artifacts container (infra/signer/build_package.py), read
// with the same identity; its host storage is a small account of its own, reached with the identity
// too (Blob Data Owner on the host's two containers only).

@description('Azure region.')
param location string

@description('Function app name (globally unique host name).')
param functionAppName string

@description('Key Vault name (3-24 characters, globally unique).')
param keyVaultName string

@description('Storage account name of the Functions host (3-24 lower-case letters and digits).')
param hostStorageAccountName string

@description('Resource id of the user-assigned identity the Function runs as (the workflow\'s).')
param identityId string

@description('Client id of that identity.')
param identityClientId string

@description('Principal id of that identity.')
param identityPrincipalId string

@description('Blob URL of the signer package (build_package.py) in the artifacts container.')
param packageUrl string

@description('Key id the approvers know the signing key under.')
param decisionKeyId string

@description('The HMAC signing key (at least 32 bytes): stored in Key Vault, nowhere else.')
@secure()
param decisionKey string

@description('Longest validity (seconds) the signer grants a decision.')
param maxTtlSeconds int

@description('Tags of every resource.')
param tags object

var keyVaultSecretsUser = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '4633458b-17de-408a-b874-0445c86b69e6')
var storageBlobDataOwner = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b')

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_109: no firewall rules: the Functions platform resolves the Key Vault reference from shared infrastructure, which a Consumption app cannot pin to a VNet; access is Entra ID RBAC only (one identity, one secret)
  // checkov:skip=CKV_AZURE_189: public network access stays on for the same reason; a Premium or Flex plan with VNet integration and a private endpoint can turn it off
  name: keyVaultName
  location: location
  tags: tags
  properties: {
    tenantId: tenant().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource signingKey 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  // checkov:skip=CKV_AZURE_41: the HMAC key is rotated by deploying a new key under a new key id (the approvers hold both meanwhile), not by expiry: an expired key would stop every approval
  parent: vault
  name: 'se-bridge-decision-key'
  properties: {
    value: decisionKey
    contentType: 'text/plain; HMAC-SHA256 key of se-bridge decisions'
  }
}

resource readsSigningKey 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(signingKey.id, identityPrincipalId, keyVaultSecretsUser)
  scope: signingKey
  properties: {
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: keyVaultSecretsUser
    description: 'The se-bridge signer reads its signing key'
  }
}

resource hostStorage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35: the Consumption host reaches its storage over the public endpoint (no VNet integration); shared keys are off, access is the identity's Blob Data Owner on two containers
  // checkov:skip=CKV_AZURE_43: the name is built from the prefix and uniqueString() (lower-case letters and digits, 24 at most), which the check cannot evaluate
  // checkov:skip=CKV_AZURE_206: LRS: the host's state (locks, function keys) is rebuilt by the platform
  name: hostStorageAccountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    supportsHttpsTrafficOnly: true
    defaultToOAuthAuthentication: true
  }
}

resource hostBlobs 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: hostStorage
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource hostContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for name in [
  'azure-webjobs-hosts'
  'azure-webjobs-secrets'
]: {
  parent: hostBlobs
  name: name
  properties: {
    publicAccess: 'None'
  }
}]

resource hostOwnsContainers 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in [
  'azure-webjobs-hosts'
  'azure-webjobs-secrets'
]: {
  name: guid(hostContainers[i].id, identityPrincipalId, storageBlobDataOwner)
  scope: hostContainers[i]
  properties: {
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: storageBlobDataOwner
    description: 'The se-bridge signer\'s Functions host state'
  }
}]

resource plan 'Microsoft.Web/serverfarms@2023-12-01' = {
  // checkov:skip=CKV_AZURE_225: a Consumption (Y1) plan has no zone redundancy setting; the signer is an example path, approvals do not depend on it
  name: '${functionAppName}-plan'
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'Y1'
    tier: 'Dynamic'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2023-12-01' = {
  // checkov:skip=CKV_AZURE_222: the workflow calls the Function over the internet (Consumption Logic Apps have no VNet); the function key guards it
  // checkov:skip=CKV_AZURE_17: callers authenticate with the function key; client certificates are not used by Logic Apps' HTTP action here
  // checkov:skip=CKV_AZURE_212: Consumption scales on demand; there is no instance minimum to set
  // checkov:skip=CKV_AZURE_213: no health check path on Consumption (the platform restarts failed hosts)
  name: functionAppName
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    keyVaultReferenceIdentity: identityId
    clientCertEnabled: false
    siteConfig: {
      linuxFxVersion: 'Python|3.11'
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      appSettings: [
        {
          name: 'FUNCTIONS_EXTENSION_VERSION'
          value: '~4'
        }
        {
          name: 'FUNCTIONS_WORKER_RUNTIME'
          value: 'python'
        }
        {
          name: 'AzureWebJobsStorage__accountName'
          value: hostStorage.name
        }
        {
          name: 'AzureWebJobsStorage__credential'
          value: 'managedidentity'
        }
        {
          name: 'AzureWebJobsStorage__clientId'
          value: identityClientId
        }
        {
          name: 'WEBSITE_RUN_FROM_PACKAGE'
          value: packageUrl
        }
        {
          name: 'WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID'
          value: identityId
        }
        {
          name: 'SE_DECISION_KEY'
          value: '@Microsoft.KeyVault(SecretUri=${signingKey.properties.secretUri})'
        }
        {
          name: 'SE_DECISION_KEY_ID'
          value: decisionKeyId
        }
        {
          name: 'SE_DECISION_MAX_TTL_SECONDS'
          value: string(maxTtlSeconds)
        }
      ]
    }
  }
  dependsOn: [
    readsSigningKey
    hostOwnsContainers
  ]
}

@description('The signer\'s URL (POST, with the function key in x-functions-key).')
output signUrl string = 'https://${functionApp.properties.defaultHostName}/api/sign'

@description('Resource id of the function app (listKeys of its host gives the function key).')
output functionAppId string = functionApp.id
