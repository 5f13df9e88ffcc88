// The ops console (se-bridge console, issue 20) on Azure Container Apps, behind Entra ID.
//
// Who may do what is decided in two places, both here:
//   * Container Apps authentication (authConfigs) signs every person in with Entra ID before a
//     request reaches the container, and passes who they are in X-MS-CLIENT-PRINCIPAL; the console
//     (--auth entra) reads it, and only holders of the app role `approverRole` may approve.
//   * the console's own identity: Event Hubs Data Receiver on the records hub (its own consumer
//     group, every replica reads everything), Data Sender on the decisions hub, Key Vault Secrets
//     User on the one secret holding its signing key. Nothing else.
// The signing key lives in Key Vault only: the container app's secret is a Key Vault reference the
// platform resolves with the console's identity and mounts as a file (--key console=<file>); it is
// never an environment variable, an app setting or a template output. The Entra client secret of
// the sign-in is held the same way.
//
// One replica: a page's CSRF token is signed with a key of the process that served the page (the
// console keeps no session store), and one replica serves a fleet of 10 000 VMs in ~100 MB
// (docs/performance.md).

@description('Azure region.')
param location string

@description('Container app name (2-32 lower-case letters, digits and hyphens).')
param appName string

@description('Container Apps environment name.')
param environmentName string

@description('Key Vault name (3-24 characters, globally unique).')
param keyVaultName string

@description('Name of the console\'s user-assigned identity.')
param identityName string

@description('Container image built from this repository by deploy/container/Dockerfile (az acr build; docs/console.md), e.g. <registry>.azurecr.io/se-bridge:0.1.0.')
param image string

@description('Azure Container Registry (in this resource group) the image is pulled from with the console\'s identity (AcrPull); empty: a registry that needs no credential.')
param registryName string = ''

@description('Event Hubs namespace name.')
param namespaceName string

@description('Hub the agents and approvers publish records to.')
param eventsHubName string

@description('Hub the console publishes decisions to.')
param decisionsHubName string

@description('Consumer group of the console on the records hub.')
param consumerGroup string

@description('Key id the approvers know the console\'s signing key under (their --key).')
param decisionKeyId string

@description('The Ed25519 private key (PEM) the console signs decisions with; the approvers and agents hold its public half. Stored in Key Vault, nowhere else.')
@secure()
param decisionKey string

@description('Application (client) id of the Entra app registration people sign in to.')
param entraClientId string

@description('Client secret of that app registration: stored in Key Vault, nowhere else.')
@secure()
param entraClientSecret string

@description('App role of that registration whose holders may approve (everyone else signed in may look).')
param approverRole string

@description('Storage account (the deployment\'s own) whose container `console-tokens` is the sign-in token store.')
param tokenStoreAccountName string

@description('Log Analytics workspace (resource id) the environment sends its logs to; empty: none.')
param logAnalyticsWorkspaceId string

@description('Tags of every resource.')
param tags object

var port = 8720
// The container app's names for its two Key Vault references (names, not values; the sign-in one is
// the name Container Apps authentication looks for by convention).
var keyRefName = 'console-key'
var signInRefName = 'microsoft-provider-authentication-secret'
var keyVaultSecretsUser = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '4633458b-17de-408a-b874-0445c86b69e6')
var eventHubsDataReceiver = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde')
var storageBlobDataContributor = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'ba92f5b4-2d11-453d-a403-e96b0029c9fe')
var eventHubsDataSender = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '2b629674-e913-4c01-ae53-ef4638d8f975')
var acrPull = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '7f951dda-4ed3-4680-a7ca-43fe172d538d')
var namespaceFqdn = '${namespaceName}.servicebus.windows.net'
// Entra ID's v2.0 issuer of this tenant: who signs people in, and whose ID tokens the console proves.
var oidcIssuer = '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
// The app's own name (Container Apps: <app>.<environment's default domain>): the only Host served.
var publicHost = '${appName}.${containerEnv.properties.defaultDomain}'
var credential = 'credential=managed&client_id=${identity.properties.clientId}'

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: identityName
  location: location
  tags: tags
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

resource registry 'Microsoft.ContainerRegistry/registries@2025-11-01' existing = if (!empty(registryName)) {
  name: empty(registryName) ? 'unused' : registryName
}

// The image is pulled with the console's own identity (issue 34: no registry, no pull identity).
resource pullsImage 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(registryName)) {
  name: guid(resourceGroup().id, registryName, identity.id, acrPull)
  scope: registry
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: acrPull
    description: 'The se-bridge console pulls its image'
  }
}

resource readsRecords 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(eventsHub.id, identity.id, eventHubsDataReceiver)
  scope: eventsHub
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: eventHubsDataReceiver
    description: 'The se-bridge console reads the fleet\'s records and audits'
  }
}

resource sendsDecisions 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(decisionsHub.id, identity.id, eventHubsDataSender)
  scope: decisionsHub
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: eventHubsDataSender
    description: 'The se-bridge console publishes the decisions people make in it'
  }
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_109: no firewall rules: a Consumption Container Apps environment resolves Key Vault references from shared infrastructure; access is Entra ID RBAC only (one identity, two secrets)
  // checkov:skip=CKV_AZURE_189: public network access stays on for the same reason; an environment with VNet integration and a private endpoint can turn it off
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
  // checkov:skip=CKV_AZURE_41: the signing key is rotated by deploying a new key under a new key id (the approvers hold both meanwhile), not by expiry: an expired key would stop every approval made in the console
  parent: vault
  name: 'se-bridge-console-key'
  properties: {
    value: decisionKey
    contentType: 'application/x-pem-file; Ed25519 private key of se-bridge decisions'
  }
}

resource signInSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  // checkov:skip=CKV_AZURE_41: the client secret's expiry is the app registration's; the vault keeps what Entra issued
  parent: vault
  name: 'se-bridge-console-entra-secret'
  properties: {
    value: entraClientSecret
    contentType: 'text/plain; Entra client secret of the console sign-in'
  }
}

resource readsSigningKey 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(signingKey.id, identity.id, keyVaultSecretsUser)
  scope: signingKey
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: keyVaultSecretsUser
    description: 'The se-bridge console reads its signing key'
  }
}

resource readsSignInSecret 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(signInSecret.id, identity.id, keyVaultSecretsUser)
  scope: signInSecret
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: keyVaultSecretsUser
    description: 'Container Apps authentication reads the console sign-in secret'
  }
}

resource containerEnv 'Microsoft.App/managedEnvironments@2024-03-01' = {
  name: environmentName
  location: location
  tags: tags
  properties: {
    appLogsConfiguration: empty(logAnalyticsWorkspaceId) ? null : {
      destination: 'azure-monitor'
    }
  }
}

resource environmentLogs 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(logAnalyticsWorkspaceId)) {
  name: 'se-bridge-console'
  scope: containerEnv
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
  }
}

resource app 'Microsoft.App/containerApps@2024-03-01' = {
  name: appName
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    managedEnvironmentId: containerEnv.id
    configuration: {
      activeRevisionsMode: 'Single'
      ingress: {
        external: true
        targetPort: port
        transport: 'http'
        allowInsecure: false
      }
      registries: empty(registryName) ? [] : [
        {
          server: registry.properties.loginServer
          identity: identity.id
        }
      ]
      secrets: [
        {
          name: keyRefName
          keyVaultUrl: signingKey.properties.secretUri
          identity: identity.id
        }
        {
          name: signInRefName
          keyVaultUrl: signInSecret.properties.secretUri
          identity: identity.id
        }
      ]
    }
    template: {
      containers: [
        {
          name: 'console'
          image: image
          command: [
            'se-bridge'
          ]
          // Who a person is comes from the ID token Container Apps authentication passes
          // (X-MS-TOKEN-AAD-ID-TOKEN), verified against Entra ID's keys (--oidc-*, issue 31); a request
          // naming another Host than the app's own name is refused (--public-host).
          args: [
            'console'
            '--auth'
            'entra'
            '--approver-role'
            approverRole
            '--events-source'
            'eventhubs://${namespaceFqdn}/${eventsHubName}?${credential}&consumer_group=${consumerGroup}'
            '--sink'
            'eventhubs://${namespaceFqdn}/${decisionsHubName}?${credential}'
            '--key'
            '${decisionKeyId}=/mnt/se-bridge-keys/${keyRefName}'
            '--listen'
            '0.0.0.0:${port}'
            '--state-dir'
            '/tmp/se-bridge-console'
            '--oidc-issuer'
            oidcIssuer
            '--oidc-audience'
            entraClientId
            '--public-host'
            publicHost
          ]
          resources: {
            cpu: json('0.5')
            memory: '1Gi'
          }
          probes: [
            {
              type: 'Liveness'
              httpGet: {
                path: '/healthz'
                port: port
              }
              periodSeconds: 10
            }
            {
              type: 'Readiness'
              httpGet: {
                path: '/readyz'
                port: port
              }
              periodSeconds: 5
            }
          ]
          volumeMounts: [
            {
              volumeName: 'keys'
              mountPath: '/mnt/se-bridge-keys'
            }
          ]
        }
      ]
      volumes: [
        {
          name: 'keys'
          storageType: 'Secret'
          secrets: [
            {
              secretRef: keyRefName
              path: keyRefName
            }
          ]
        }
      ]
      scale: {
        minReplicas: 1
        maxReplicas: 1
      }
    }
  }
  dependsOn: [
    pullsImage
    readsSigningKey
    readsSignInSecret
    readsRecords
    sendsDecisions
  ]
}

// The sign-in token store (issue 31): with it, Container Apps authentication passes each request's ID
// token (X-MS-TOKEN-AAD-ID-TOKEN), which the console verifies against Entra ID's keys; without it the
// console could only believe a header, and it believes none. A container of the deployment's storage
// account (shared keys off), read and written by the console's identity only.
resource tokenAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: tokenStoreAccountName
}

resource tokenBlobs 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: tokenAccount
  name: 'default'
}

resource tokenContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: tokenBlobs
  name: 'console-tokens'
  properties: {
    publicAccess: 'None'
  }
}

resource keepsTokens 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(tokenContainer.id, identity.id, storageBlobDataContributor)
  scope: tokenContainer
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: storageBlobDataContributor
    description: 'The se-bridge console\'s sign-in token store'
  }
}

// 2024-10-02-preview: the first version whose token store takes a managed identity instead of a SAS
// URL (a SAS needs shared keys, which the account keeps off).
resource signIn 'Microsoft.App/containerApps/authConfigs@2024-10-02-preview' = {
  parent: app
  name: 'current'
  dependsOn: [
    keepsTokens
  ]
  properties: {
    platform: {
      enabled: true
    }
    login: {
      tokenStore: {
        enabled: true
        azureBlobStorage: {
          blobContainerUri: '${tokenAccount.properties.primaryEndpoints.blob}${tokenContainer.name}'
          managedIdentityResourceId: identity.id
        }
      }
    }
    globalValidation: {
      unauthenticatedClientAction: 'RedirectToLoginPage'
      redirectToProvider: 'azureactivedirectory'
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: entraClientId
          clientSecretSettingName: signInRefName
          openIdIssuer: oidcIssuer
        }
        validation: {
          allowedAudiences: [
            'api://${entraClientId}'
          ]
        }
      }
    }
  }
}

@description('The console\'s address (people sign in with Entra ID there).')
output url string = 'https://${app.properties.configuration.ingress.fqdn}'

@description('The console identity\'s principal id.')
output principalId string = identity.properties.principalId
