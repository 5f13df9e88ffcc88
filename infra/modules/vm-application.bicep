// The agent as a VM Application (Azure Compute Gallery): the delivery for scale sets and for fleets
// of thousands of VMs (docs/deploy.md "Fleet rollout"). A VM or scale set lists the application
// version in its applicationProfile.galleryApplications (the `galleryApplication` output, or
// deploy/enable_vm_application.py for ones that exist); the platform downloads the package from the
// gallery's own replicas (no internet, no package index, no storage access needed on the VM) and
// runs the install command below as root. It coexists with any Custom Script extension or Run Command.
//
// The package is built by deploy/vmapp/build_package.py (the installer, deploy/vmapp/manage.sh and
// a wheel of every dependency) and uploaded with the settings JSON to the artifacts container. The
// gallery reads both at publish time with its own user-assigned identity (plain blob URLs: no SAS
// is stored in the version, which would keep it readable in plain text; Microsoft's "Publish VM
// applications using managed identity"; a gallery's identity is in GalleryRP 2025-03-03, the
// version pinned here: 2025-04-01 is a ComputeRP version, which galleries refuse). A VM Application
// has no protected settings: the settings must hold no secret (keys stay in Key Vault; the settings name their
// https://<vault>/secrets/<name> URLs).
//
// Limits checked here or by infra/tools/bicep_lint.py: commands <= 4,096 characters, a version name
// Major.Minor.Patch, 1-3 replicas per region; manage actions and file names cannot change on an
// existing version (publish a new version instead).

@description('Region of the gallery and the version\'s source.')
param location string

@description('Compute gallery name (unique per subscription; letters, digits, periods, underscores).')
param galleryName string

@description('Application name: the VM Application manager\'s directory on the VM.')
param applicationName string = 'se-bridge'

@description('Version to publish, Major.Minor.Patch (e.g. the package version, 0.3.0).')
param version string

@description('Storage account of the artifacts container (infra output storageAccountName).')
param artifactsStorageAccountName string

@description('Container holding the package and the settings.')
param artifactsContainerName string = 'artifacts'

@description('Blob name of the package (python deploy/vmapp/build_package.py se-bridge.tar.gz).')
param packageBlobName string

@description('Blob name of the settings JSON ({"agent": {...}, "approver": {...}}; no secrets).')
param settingsBlobName string

@description('Regions to replicate the version to (every region of the VMs that use it); the source region is always one (the platform requires it).')
param targetRegions array = [
  location
]

@description('Replicas per region (more replicas spread the downloads of a large rollout).')
@minValue(1)
@maxValue(3)
param regionalReplicaCount int = 1

@description('Storage of the replicas (Standard_ZRS where the region has zones).')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
])
param replicaStorageAccountType string = 'Standard_LRS'

@description('Mark a failed install as a failed VM deployment (the platform reports success otherwise).')
param treatFailureAsDeploymentFailure bool = true

param tags object = {}

// Role definition id: Storage Blob Data Contributor, the role Microsoft documents for the gallery's
// identity; granted on the artifacts container only, not on the account.
var storageBlobDataContributor = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'ba92f5b4-2d11-453d-a403-e96b0029c9fe')
var blobBase = '${account.properties.primaryEndpoints.blob}${artifactsContainerName}'
// The platform downloads the package and the settings into the version's directory under these names
// and runs the commands there with /bin/bash; the remove command gets the package again and unpacks it.
var regions = union([
  location
], targetRegions)
var packageFileName = 'se-bridge.tar.gz'
var configFileName = 'se-bridge-settings.json'
var installCommand = 'tar -xzf ${packageFileName} && sh se-bridge/manage.sh install ${configFileName}'
var updateCommand = 'tar -xzf ${packageFileName} && sh se-bridge/manage.sh update ${configFileName}'
var removeCommand = 'tar -xzf ${packageFileName} && sh se-bridge/manage.sh remove'

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: artifactsStorageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource artifacts 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: artifactsContainerName
}

resource galleryIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${galleryName}-publisher'
  location: location
  tags: tags
}

resource galleryReadsArtifacts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(artifacts.id, galleryIdentity.id, storageBlobDataContributor)
  scope: artifacts
  properties: {
    principalId: galleryIdentity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: storageBlobDataContributor
    description: 'the compute gallery reads the se-bridge VM Application package'
  }
}

resource gallery 'Microsoft.Compute/galleries@2025-03-03' = {
  name: galleryName
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${galleryIdentity.id}': {}
    }
  }
  properties: {
    description: 'Scheduled Events bridge VM Applications'
  }
}

resource application 'Microsoft.Compute/galleries/applications@2025-03-03' = {
  parent: gallery
  name: applicationName
  location: location
  tags: tags
  properties: {
    supportedOSType: 'Linux'
    description: 'Scheduled Events bridge: agent and approver (deploy/vmapp)'
  }
}

resource applicationVersion 'Microsoft.Compute/galleries/applications/versions@2025-03-03' = {
  parent: application
  name: version
  location: location
  tags: tags
  dependsOn: [
    galleryReadsArtifacts // the gallery reads the blobs with that role while it publishes
  ]
  properties: {
    publishingProfile: {
      source: {
        mediaLink: '${blobBase}/${packageBlobName}'
        defaultConfigurationLink: '${blobBase}/${settingsBlobName}'
      }
      manageActions: {
        install: installCommand
        update: updateCommand
        remove: removeCommand
      }
      settings: {
        packageFileName: packageFileName
        configFileName: configFileName
      }
      targetRegions: [for region in regions: {
        name: region
        regionalReplicaCount: regionalReplicaCount
        storageAccountType: replicaStorageAccountType
      }]
      excludeFromLatest: false
    }
    safetyProfile: {
      allowDeletionOfReplicatedLocations: false
    }
  }
}

@description('Resource id of the published version (packageReferenceId).')
output applicationVersionId string = applicationVersion.id

@description('The entry for a VM\'s or scale set\'s applicationProfile.galleryApplications.')
output galleryApplication object = {
  packageReferenceId: applicationVersion.id
  treatFailureAsDeploymentFailure: treatFailureAsDeploymentFailure
}
