// The container registry the central services' image is built into (issue 34): nothing in the
// repository built the console's image. `az acr build --registry <name> --image se-bridge:<version>
// --file deploy/container/Dockerfile .` builds deploy/container/Dockerfile in Azure from this
// repository (no Docker needed where it is run); the console pulls it with its own identity (AcrPull
// on this registry, modules/console.bicep), never with the registry's admin user (off).

@description('Azure region.')
param location string

@description('Registry name (5-50 letters and digits, globally unique).')
@minLength(5)
@maxLength(50)
param registryName string

@description('Tags of every resource.')
param tags object

resource registry 'Microsoft.ContainerRegistry/registries@2025-11-01' = {
  // checkov:skip=CKV_AZURE_139: public network access stays on: `az acr build` and a Consumption Container Apps environment reach it from Azure's shared infrastructure; pulls need an Entra ID role (AcrPull), the admin user is off
  // checkov:skip=CKV_AZURE_166: image quarantine is a Premium preview feature; only az acr build from this repository pushes here
  // checkov:skip=CKV_AZURE_233: zone redundancy is a Premium feature; the image is rebuilt from the repository in minutes
  // checkov:skip=CKV_AZURE_163: image scanning is Microsoft Defender for Containers, a subscription-level plan, not a registry property
  name: registryName
  location: location
  tags: tags
  sku: {
    name: 'Basic'
  }
  properties: {
    adminUserEnabled: false
    // (a property of 2025-04-01 and later: 2023-07-01 did not have it, issue 34's type check)
    anonymousPullEnabled: false
  }
}

@description('The registry\'s name.')
output name string = registry.name

@description('Its login server (<name>.azurecr.io): the image is <loginServer>/se-bridge:<version>.')
output loginServer string = registry.properties.loginServer
