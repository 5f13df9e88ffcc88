// Scheduled Events bridge, platform side: deployed once per environment into one resource group by a
// platform team (docs/deploy.md). Creates the Event Hubs namespace with the records and decisions
// hubs, the checkpoint/artifact storage, the managed identities of the agents and of a fleet approver
// with least-privilege roles, and optionally an example Logic App and an Azure Data Explorer
// dashboard database. The outputs are what deploy/vm-extension.bicep needs.
//
//   az deployment group create -g rg-se-bridge -f infra/main.bicep -p namePrefix=sebridge
targetScope = 'resourceGroup'

@description('Azure region of every resource (default: the resource group\'s).')
param location string = resourceGroup().location

@description('Prefix of every resource name: 2-10 lower-case letters and digits.')
@minLength(2)
@maxLength(10)
param namePrefix string = 'sebridge'

@description('Event Hubs tier: Standard (default) or Premium.')
@allowed([
  'Standard'
  'Premium'
])
param eventHubsSku string = 'Standard'

@description('Throughput units (Standard) or processing units (Premium).')
@minValue(1)
@maxValue(40)
param eventHubsCapacity int = 1

@description('Refuse SAS keys on the namespace: every client uses Entra ID (managed identities). Keep true unless a consumer cannot use Entra ID.')
param disableLocalAuth bool = true

@description('Public network access to the namespace and the storage account: Enabled, or Disabled when private endpoints are added.')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string = 'Enabled'

@description('Name of the records hub (agents publish, dashboards and approvers read).')
param eventsHubName string = 'se-records'

@description('Name of the decisions hub (dashboards, Logic Apps and engineers publish, approvers read).')
param decisionsHubName string = 'se-decisions'

@description('Partitions of the records hub (records are keyed by vmId). Choose for the fleet\'s final size: on Standard the count cannot change after the hub is created (Premium can add partitions).')
@minValue(1)
@maxValue(32)
param eventsPartitionCount int = 4

@description('Partitions of the decisions hub (fixed after creation on Standard, as above).')
@minValue(1)
@maxValue(32)
param decisionsPartitionCount int = 2

// Retention per tier, each with the tier's own limit (Standard 1-7 days, Premium 1-90): a value the
// tier refuses is refused by the template before anything is deployed, not halfway by Event Hubs.
@description('Days the hubs keep messages when eventHubsSku is Standard (the tier allows 1-7).')
@minValue(1)
@maxValue(7)
param standardRetentionDays int = 7

@description('Days the hubs keep messages when eventHubsSku is Premium (the tier allows 1-90).')
@minValue(1)
@maxValue(90)
param premiumRetentionDays int = 7

@description('Log Analytics workspace (resource id) that receives the diagnostic logs and metrics of every resource here; empty: none.')
param logAnalyticsWorkspaceId string = ''

@description('Subnet (resource id) for private endpoints of Event Hubs, the storage account (blob) and Data Explorer; empty: none. Set publicNetworkAccess to Disabled with it.')
param privateEndpointSubnetId string = ''

@description('Private DNS zones (resource ids) the private endpoints register in: {"eventhubs": privatelink.servicebus.windows.net, "blob": privatelink.blob.core.windows.net, "kusto": privatelink.<region>.kusto.windows.net}; a missing key: no registration for that endpoint.')
param privateDnsZoneIds object = {}

@description('Subnets (resource ids, with the Microsoft.EventHub service endpoint) admitted by the Event Hubs network rules when publicNetworkAccess is Enabled; empty: no rules (every network).')
param eventHubsSubnetIds array = []

@description('Storage replication: Standard_ZRS where the region has zones, Standard_LRS otherwise.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
param storageSku string = 'Standard_ZRS'

@description('Storage firewall: Allow, or Deny to admit only storageSubnetIds and trusted Azure services.')
@allowed([
  'Allow'
  'Deny'
])
param storageNetworkDefaultAction string = 'Allow'

@description('Subnets admitted by the storage firewall when storageNetworkDefaultAction is Deny.')
param storageSubnetIds array = []

@description('Deploy the example Logic App that approves user-initiated events.')
param deployLogicApp bool = false

@description('Resource groups (of this subscription) whose VMs and scale sets the fleet approver may approve through Azure Resource Manager when no agent answers (--arm fallback): each gets the built-in Scheduled Events Contributor role for the approver\'s identity. Empty: no ARM path.')
param armAcknowledgeResourceGroups array = []

@description('Logic App trigger: webhook (agents post records with a webhook sink) or eventhub (reads the records hub).')
@allowed([
  'webhook'
  'eventhub'
])
param logicAppTrigger string = 'webhook'

@description('Blob URL of the signer Function\'s package (python infra/signer/build_package.py signer.zip, uploaded to the artifacts container); required when deployLogicApp is true.')
param signerPackageUrl string = ''

@description('Key id under which the approvers know the Logic App\'s signing key.')
param logicAppDecisionKeyId string = 'logicapp'

@description('The Logic App\'s HMAC signing key (at least 32 bytes); required when deployLogicApp is true. Stored in a Key Vault the signer Function reads it from, nowhere else.')
@secure()
param logicAppDecisionKey string = ''

@description('Seconds a Logic App decision stays valid.')
@minValue(60)
@maxValue(86400)
param logicAppDecisionTtlSeconds int = 900

@description('Publish the agent as a VM Application (Azure Compute Gallery) with this version, Major.Minor.Patch: the delivery for scale sets and large fleets (docs/deploy.md). Empty: no gallery.')
param vmApplicationVersion string = ''

@description('Blob name, in the artifacts container, of the VM Application package (python deploy/vmapp/build_package.py se-bridge.tar.gz).')
param vmApplicationPackageBlob string = 'se-bridge.tar.gz'

@description('Blob name, in the artifacts container, of the VM Application settings JSON (the installer\'s --settings; no secrets: keys as Key Vault URLs).')
param vmApplicationSettingsBlob string = 'se-bridge-settings.json'

@description('Regions the VM Application version is replicated to (those of the VMs); empty: this deployment\'s region.')
param vmApplicationRegions array = []

@description('Deploy Azure Data Explorer (cluster, database, table, mapping, data connection) for the ops dashboard.')
param deployDataExplorer bool = false

@description('Send records to Azure Monitor as well (docs/azure-monitor.md): custom tables, a Direct data collection rule, a workbook, two alert rules and an action group in the workspace of logAnalyticsWorkspaceId (required then; its region is monitorLocation).')
param deployAzureMonitor bool = false

@description('Region of the Log Analytics workspace (the data collection rule is created there); default: location.')
param monitorLocation string = location

@description('Emails the alert rules notify ("maintenance within N minutes that nothing approved or prepared", "an agent stopped reporting").')
param alertEmails array = []

@description('Minutes ahead the unapproved-maintenance alert looks.')
param alertHorizonMinutes int = 30

@description('Data Explorer SKU name.')
param dataExplorerSkuName string = 'Dev(No SLA)_Standard_E2a_v4'

@description('Data Explorer SKU tier: Basic (dev SKU) or Standard.')
@allowed([
  'Basic'
  'Standard'
])
param dataExplorerSkuTier string = 'Basic'

@description('Object id of an Entra ID group allowed to query the dashboard database; empty: none.')
param dashboardViewerGroupObjectId string = ''

@description('Deploy the ops console (se-bridge console) on Azure Container Apps behind Entra ID sign-in (docs/console.md).')
param deployConsole bool = false

@description('Read Azure\'s own Scheduled Events channel (Event Grid system topic of this subscription\'s maintenance resources -> a dedicated hub) with se-bridge azure-channel, run under its own identity (<prefix>-azure-channel) (docs/azure-channel.md). Azure publishes only for VMs, scale sets and availability sets whose scheduledEventsPolicy enables eventGridAndResourceGraph (preview).')
param deployAzureChannel bool = false

@description('With deployAzureChannel: the system topic of this subscription\'s MaintenanceResources that already exists (in this resource group), to subscribe to instead of creating one. Azure allows one per source: a second deployment in a subscription must name the first one\'s.')
param existingMaintenanceSystemTopicName string = ''

@description('Container image of the console, built from this repository by deploy/container/Dockerfile into the deployment\'s registry (deployRegistry; docs/deploy.md), e.g. <registryLoginServer>/se-bridge:0.1.0; required when deployConsole is true.')
param consoleImage string = ''

@description('Create the container registry the central services\' image is built into (az acr build), pulled from by the console with its own identity.')
param deployRegistry bool = false

@description('Application (client) id of the Entra app registration people sign in to the console with; required when deployConsole is true.')
param consoleEntraClientId string = ''

@description('Client secret of that app registration; required when deployConsole is true. Stored in the console\'s Key Vault, nowhere else.')
@secure()
param consoleEntraClientSecret string = ''

@description('App role (of that registration) whose holders may approve in the console.')
param consoleApproverRole string = 'Maintenance.Approve'

@description('Key id under which the approvers know the console\'s signing key.')
param consoleDecisionKeyId string = 'console'

@description('The console\'s signing key: an Ed25519 private key, PEM (se-bridge keygen; its public half goes to the approvers and agents); required when deployConsole is true. Stored in the console\'s Key Vault, nowhere else.')
@secure()
param consoleDecisionKey string = ''

@description('Deploy the central services (infra/modules/central.bicep, docs/deploy.md step 6c): a Flexible scale set whose instances each run a fleet approver (one consumer group: a pair shares the decisions) and, with deployAzureChannel, Azure\'s channel, under the approvers\' identity, configured by this template.')
param deployCentral bool = false

@description('With deployCentral: the subnet of the central instances (they reach the agents\' relay on port 8710).')
param centralSubnetId string = ''

@description('With deployCentral: the SSH public key of the instances\' administrator (no password).')
param centralAdminPublicKey string = ''

@description('With deployCentral: instances (each runs both services; 2 for a pair that survives one).')
@minValue(1)
@maxValue(5)
param centralInstanceCount int = 2

@description('With deployCentral: blob name of the wheel in the artifacts container (make wheel; uploaded as in step 2).')
param centralWheelBlob string = 'scheduled_events_bridge-0.1.0-py3-none-any.whl'

@description('With deployCentral: the keys the approvers verify decisions with, [{id, publicKey}] (the public half, PEM, that se-bridge keygen writes beside the private key): the console\'s (id consoleDecisionKeyId), the Logic App signer\'s, a person\'s.')
param centralDecisionKeys array = []

@description('With deployCentral: the relay key the agents hold as relay_key fleet=... (at least 32 bytes). Stored in the central Key Vault, nowhere else.')
@secure()
param centralRelayKey string = ''

@description('With deployCentral and deployAzureChannel: Azure\'s channel\'s record signing key (at least 32 bytes; the console\'s --azure-key). Stored in the central Key Vault, nowhere else.')
@secure()
param centralAzureSignKey string = ''

@description('Tags of every resource.')
param tags object = {
  workload: 'scheduled-events-bridge'
}

var retentionDays = eventHubsSku == 'Standard' ? standardRetentionDays : premiumRetentionDays
var suffix = uniqueString(resourceGroup().id, namePrefix)
var compactPrefix = toLower(replace(namePrefix, '-', ''))
var namespaceName = '${namePrefix}-ehns-${suffix}'
var storageAccountName = take('${compactPrefix}st${suffix}', 24)
// The records hub: se-bridge-approver-fleet is where every fleet approver instance reads every
// partition (its events reader, --events-source: <group>-fleet, bridge/streams/topology.py). On the
// decisions hub, se-bridge-approver is the approver's default consumer group (--group), shared by the
// fleet instances through the checkpoint store; se-bridge-approver-standby is where each instance's
// standby reads every partition (bridge/approver/standby.py: an epoch reader in the shared group would
// disconnect the owners).
var eventsConsumerGroups = concat([
  'dashboard'
  'se-bridge-approver-fleet'
], deployDataExplorer ? [
  'adx'
] : [], (deployLogicApp && logicAppTrigger == 'eventhub') ? [
  'logicapp'
] : [], deployConsole ? [
  'se-bridge-console'
] : [], deployAzureChannel ? [
  'se-bridge-azure-channel-fleet'
] : [])

module eventHubs 'modules/eventhubs.bicep' = {
  name: 'se-bridge-eventhubs'
  params: {
    location: location
    namespaceName: namespaceName
    skuName: eventHubsSku
    capacity: eventHubsCapacity
    disableLocalAuth: disableLocalAuth
    publicNetworkAccess: publicNetworkAccess
    eventsHubName: eventsHubName
    decisionsHubName: decisionsHubName
    eventsPartitionCount: eventsPartitionCount
    decisionsPartitionCount: decisionsPartitionCount
    retentionDays: retentionDays
    eventsConsumerGroups: eventsConsumerGroups
    decisionsConsumerGroups: [
      'se-bridge-approver'
      'se-bridge-approver-standby'
    ]
    allowedSubnetIds: eventHubsSubnetIds
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    privateEndpointSubnetId: privateEndpointSubnetId
    privateDnsZoneId: contains(privateDnsZoneIds, 'eventhubs') ? privateDnsZoneIds.eventhubs : ''
    tags: tags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'se-bridge-storage'
  params: {
    location: location
    accountName: storageAccountName
    skuName: storageSku
    publicNetworkAccess: publicNetworkAccess
    networkDefaultAction: storageNetworkDefaultAction
    allowedSubnetIds: storageSubnetIds
    checkpointsContainerName: 'checkpoints'
    artifactsContainerName: 'artifacts'
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    privateEndpointSubnetId: privateEndpointSubnetId
    privateDnsZoneId: contains(privateDnsZoneIds, 'blob') ? privateDnsZoneIds.blob : ''
    tags: tags
  }
}

module identities 'modules/identities.bicep' = {
  name: 'se-bridge-identities'
  params: {
    location: location
    agentIdentityName: '${namePrefix}-agent'
    approverIdentityName: '${namePrefix}-approver'
    logicAppIdentityName: deployLogicApp ? '${namePrefix}-logicapp' : ''
    azureChannelIdentityName: deployAzureChannel ? '${namePrefix}-azure-channel' : ''
    tags: tags
  }
}

module rbac 'modules/rbac.bicep' = {
  name: 'se-bridge-rbac'
  params: {
    namespaceName: eventHubs.outputs.namespaceName
    eventsHubName: eventsHubName
    decisionsHubName: decisionsHubName
    storageAccountName: storage.outputs.accountName
    checkpointsContainerName: storage.outputs.containers.checkpoints
    artifactsContainerName: storage.outputs.containers.artifacts
    agentPrincipalId: identities.outputs.agent.principalId
    approverPrincipalId: identities.outputs.approver.principalId
    azureChannelPrincipalId: identities.outputs.azureChannel.principalId
    logicAppPrincipalId: identities.outputs.logicApp.principalId
    logicAppReadsEvents: deployLogicApp && logicAppTrigger == 'eventhub'
  }
}

// The fleet approver's ARM fallback (--arm fallback): acknowledge scheduled events in these resource
// groups (those of the VMs and scale sets it serves) and nowhere else.
module armAcknowledge 'modules/arm-acknowledge.bicep' = [for rg in armAcknowledgeResourceGroups: {
  name: 'se-bridge-arm-acknowledge-${rg}'
  scope: resourceGroup(rg)
  params: {
    approverPrincipalId: identities.outputs.approver.principalId
  }
}]

module signer 'modules/signer.bicep' = if (deployLogicApp) {
  name: 'se-bridge-signer'
  params: {
    location: location
    functionAppName: '${namePrefix}-signer-${suffix}'
    keyVaultName: take('${compactPrefix}kv${suffix}', 24)
    hostStorageAccountName: take('${compactPrefix}fn${suffix}', 24)
    identityId: identities.outputs.logicApp.id
    identityClientId: identities.outputs.logicApp.clientId
    identityPrincipalId: identities.outputs.logicApp.principalId
    packageUrl: signerPackageUrl
    decisionKeyId: logicAppDecisionKeyId
    decisionKey: logicAppDecisionKey
    maxTtlSeconds: logicAppDecisionTtlSeconds
    tags: tags
  }
  dependsOn: [
    rbac
  ]
}

module logicApp 'modules/logicapp.bicep' = if (deployLogicApp) {
  name: 'se-bridge-logicapp'
  params: {
    location: location
    workflowName: '${namePrefix}-approve-user-events'
    signUrl: signer.outputs.signUrl
    signerAppId: signer.outputs.functionAppId
    trigger: logicAppTrigger
    identityId: identities.outputs.logicApp.id
    namespaceFqdn: eventHubs.outputs.namespaceFqdn
    eventsHubName: eventsHubName
    decisionsHubName: decisionsHubName
    consumerGroup: 'logicapp'
    decisionTtlSeconds: logicAppDecisionTtlSeconds
    tags: tags
  }
  dependsOn: [
    rbac
  ]
}

module dataExplorer 'modules/dataexplorer.bicep' = if (deployDataExplorer) {
  name: 'se-bridge-dataexplorer'
  params: {
    location: location
    clusterName: take('${compactPrefix}adx${suffix}', 22)
    skuName: dataExplorerSkuName
    skuTier: dataExplorerSkuTier
    databaseName: 'sebridge'
    namespaceName: eventHubs.outputs.namespaceName
    eventsHubName: eventsHubName
    consumerGroup: 'adx'
    viewerGroupObjectId: dashboardViewerGroupObjectId
    publicNetworkAccess: publicNetworkAccess
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    privateEndpointSubnetId: privateEndpointSubnetId
    privateDnsZoneId: contains(privateDnsZoneIds, 'kusto') ? privateDnsZoneIds.kusto : ''
    tags: tags
  }
}

module registry 'modules/registry.bicep' = if (deployRegistry) {
  name: 'se-bridge-registry'
  params: {
    location: location
    registryName: take('${compactPrefix}acr${suffix}', 50)
    tags: tags
  }
}

module console 'modules/console.bicep' = if (deployConsole) {
  name: 'se-bridge-console'
  params: {
    location: location
    appName: take('${namePrefix}-console', 32)
    environmentName: '${namePrefix}-cae-${suffix}'
    keyVaultName: take('${compactPrefix}ckv${suffix}', 24)
    identityName: '${namePrefix}-console'
    image: consoleImage
    registryName: deployRegistry ? registry.outputs.name : ''
    namespaceName: eventHubs.outputs.namespaceName
    eventsHubName: eventsHubName
    decisionsHubName: decisionsHubName
    consumerGroup: 'se-bridge-console'
    decisionKeyId: consoleDecisionKeyId
    decisionKey: consoleDecisionKey
    entraClientId: consoleEntraClientId
    entraClientSecret: consoleEntraClientSecret
    approverRole: consoleApproverRole
    tokenStoreAccountName: storage.outputs.accountName
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    tags: tags
  }
}

module azureChannel 'modules/azure-channel.bicep' = if (deployAzureChannel) {
  name: 'se-bridge-azure-channel'
  params: {
    namespaceName: eventHubs.outputs.namespaceName
    retentionDays: retentionDays
    systemTopicName: '${namePrefix}-maintenance-${suffix}'
    existingSystemTopicName: existingMaintenanceSystemTopicName
    deadLetterAccountName: storage.outputs.accountName
    readerPrincipalId: identities.outputs.azureChannel.principalId
    tags: tags
  }
}

// The central services' specs: the outputs below and central.bicep's settings are the same strings.
var fleetDecisionsSpec = 'eventhubs://${eventHubs.outputs.namespaceFqdn}/${decisionsHubName}?credential=managed&client_id=${identities.outputs.approver.clientId}&consumer_group=se-bridge-approver&checkpoint_url=${storage.outputs.blobEndpoint}${storage.outputs.containers.checkpoints}'
var fleetEventsSpec = 'eventhubs://${eventHubs.outputs.namespaceFqdn}/${eventsHubName}?credential=managed&client_id=${identities.outputs.approver.clientId}&consumer_group=se-bridge-approver-fleet'
var centralRecordsSpec = 'eventhubs://${eventHubs.outputs.namespaceFqdn}/${eventsHubName}?credential=managed&client_id=${identities.outputs.approver.clientId}'
var azureChannelSpec = 'eventhubs://${eventHubs.outputs.namespaceFqdn}/se-azure-events?credential=managed&client_id=${identities.outputs.azureChannel.clientId}&consumer_group=se-bridge-azure-channel&checkpoint_url=${storage.outputs.blobEndpoint}${storage.outputs.containers.checkpoints}'
var azureChannelEventsSpec = 'eventhubs://${eventHubs.outputs.namespaceFqdn}/${eventsHubName}?credential=managed&client_id=${identities.outputs.azureChannel.clientId}&consumer_group=se-bridge-azure-channel-fleet'
var azureChannelRecordsSpec = 'eventhubs://${eventHubs.outputs.namespaceFqdn}/${eventsHubName}?credential=managed&client_id=${identities.outputs.azureChannel.clientId}'

module central 'modules/central.bicep' = if (deployCentral) {
  name: 'se-bridge-central'
  params: {
    location: location
    scaleSetName: '${namePrefix}-central'
    keyVaultName: take('${compactPrefix}cen${suffix}', 24)
    instanceCount: centralInstanceCount
    subnetId: centralSubnetId
    adminPublicKey: centralAdminPublicKey
    identity: identities.outputs.approver
    channelIdentity: deployAzureChannel ? identities.outputs.azureChannel : {}
    wheelUrl: '${storage.outputs.blobEndpoint}${storage.outputs.containers.artifacts}/${centralWheelBlob}'
    decisionsSpec: fleetDecisionsSpec
    approverEventsSpec: fleetEventsSpec
    recordsSinkSpec: centralRecordsSpec
    azureChannelSourceSpec: deployAzureChannel ? azureChannelSpec : ''
    azureChannelEventsSpec: deployAzureChannel ? azureChannelEventsSpec : ''
    azureChannelSinkSpec: deployAzureChannel ? azureChannelRecordsSpec : ''
    decisionKeys: centralDecisionKeys
    relayKey: centralRelayKey
    azureSignKey: centralAzureSignKey
    armScopes: [for rg in armAcknowledgeResourceGroups: '${subscription().id}/resourceGroups/${rg}']
    tags: tags
  }
  dependsOn: [
    rbac
  ]
}

// Azure Monitor: deployed in the workspace's resource group (the tables are the workspace's children).
// An empty logAnalyticsWorkspaceId with deployAzureMonitor failed with "index out of range" (issue 34):
// a stand-in id that names the missing parameter makes Azure's refusal say what to set instead.
var missingWorkspace = '/subscriptions/set-logAnalyticsWorkspaceId-to-deploy-azure-monitor/resourceGroups/set-logAnalyticsWorkspaceId/providers/Microsoft.OperationalInsights/workspaces/set-logAnalyticsWorkspaceId'
var workspaceParts = split(empty(logAnalyticsWorkspaceId) ? missingWorkspace : logAnalyticsWorkspaceId, '/')
module azureMonitor 'modules/monitor.bicep' = if (deployAzureMonitor) {
  name: 'se-bridge-azure-monitor'
  scope: resourceGroup(workspaceParts[2], workspaceParts[4])
  params: {
    workspaceName: last(workspaceParts)
    location: monitorLocation
    ruleName: '${namePrefix}-dcr-${suffix}'
    agentPrincipalIds: [
      identities.outputs.agent.principalId
    ]
    centralPrincipalIds: deployAzureChannel ? [
      identities.outputs.approver.principalId
      identities.outputs.azureChannel.principalId
    ] : [
      identities.outputs.approver.principalId
    ]
    alertEmails: alertEmails
    alertHorizonMinutes: alertHorizonMinutes
    tags: tags
  }
}

// The agent as a VM Application: the gallery reads the package and settings from the artifacts
// container with its own identity at publish time (no SAS stored anywhere).
module vmApplication 'modules/vm-application.bicep' = if (!empty(vmApplicationVersion)) {
  name: 'se-bridge-vm-application'
  params: {
    location: location
    galleryName: '${compactPrefix}gallery${suffix}'
    version: vmApplicationVersion
    artifactsStorageAccountName: storage.outputs.accountName
    artifactsContainerName: storage.outputs.containers.artifacts
    packageBlobName: vmApplicationPackageBlob
    settingsBlobName: vmApplicationSettingsBlob
    targetRegions: empty(vmApplicationRegions) ? [
      location
    ] : vmApplicationRegions
    tags: tags
  }
}

@description('Event Hubs host name for the sink and source specs (vm-extension.bicep eventHubsNamespaceFqdn).')
output eventHubsNamespaceFqdn string = eventHubs.outputs.namespaceFqdn

@description('Event Hubs namespace name.')
output eventHubsNamespaceName string = eventHubs.outputs.namespaceName

@description('Records hub name (vm-extension.bicep eventsHubName).')
output eventsHubName string = eventsHubName

@description('Decisions hub name (vm-extension.bicep decisionsHubName).')
output decisionsHubName string = decisionsHubName

@description('Client id of the agents\' identity (vm-extension.bicep agentIdentityClientId).')
output agentIdentityClientId string = identities.outputs.agent.clientId

@description('Resource id of the agents\' identity: attach it to every VM or scale set (az vm identity assign).')
output agentIdentityResourceId string = identities.outputs.agent.id

@description('Client id of the fleet approver\'s identity.')
output approverIdentityClientId string = identities.outputs.approver.clientId

@description('Resource id of the fleet approver\'s identity.')
output approverIdentityResourceId string = identities.outputs.approver.id

@description('Storage account of checkpoints and artifacts.')
output storageAccountName string = storage.outputs.accountName

@description('Base URL of the artifacts container (the wheel and installers the VM extension downloads).')
output artifactsBaseUrl string = '${storage.outputs.blobEndpoint}${storage.outputs.containers.artifacts}'

@description('Base URL of the checkpoints container (fleet approver).')
output checkpointsContainerUrl string = '${storage.outputs.blobEndpoint}${storage.outputs.containers.checkpoints}'

@description('Agent sink spec for the records hub (managed identity, no secret).')
output agentSinkSpec string = 'eventhubs://${eventHubs.outputs.namespaceFqdn}/${eventsHubName}?credential=managed&client_id=${identities.outputs.agent.clientId}'

@description('Fleet approver --source: the decisions hub with the approver\'s identity, consumer group se-bridge-approver and the checkpoint store (partition ownership shared by the instances).')
output fleetApproverDecisionsSpec string = fleetDecisionsSpec

@description('Fleet approver --events-source: the records hub with the approver\'s identity, consumer group se-bridge-approver-fleet, no checkpoint store (every instance reads every partition).')
output fleetApproverEventsSpec string = fleetEventsSpec

@description('Data Explorer query URI (empty when not deployed).')
output dataExplorerUri string = deployDataExplorer ? dataExplorer.outputs.clusterUri : ''

@description('Logic App workflow id (empty when not deployed); its webhook URL comes from listCallbackUrl.')
output logicAppWorkflowId string = deployLogicApp ? logicApp.outputs.workflowId : ''

@description('Resource id of the published VM Application version (deploy/enable_vm_application.py --version-id; applicationProfile.galleryApplications[].packageReferenceId); empty when none was published.')
output vmApplicationVersionId string = empty(vmApplicationVersion) ? '' : vmApplication.outputs.applicationVersionId

@description('se-bridge azure-channel --source (Event Grid\'s deliveries; checkpoints beside the approvers\'); empty unless deployAzureChannel.')
output azureChannelSourceSpec string = deployAzureChannel ? azureChannelSpec : ''

@description('The central scale set (deployCentral): its instances run the fleet approvers and Azure\'s channel.')
output centralScaleSetId string = deployCentral ? central.outputs.scaleSetId : ''

@description('The agents\' second --sink for Azure Monitor (empty unless deployAzureMonitor): the rule\'s own endpoint and immutable id, the agents\' identity.')
output agentMonitorSinkSpec string = deployAzureMonitor ? 'azuremonitor://${replace(azureMonitor.outputs.logsIngestionEndpoint, 'https://', '')}/${azureMonitor.outputs.immutableId}?credential=managed&client_id=${identities.outputs.agent.clientId}' : ''

@description('The fleet approvers\' and Azure\'s channel\'s --sink for Azure Monitor (empty unless deployAzureMonitor): the central rule (approvals and findings; agents cannot send to it), their identity.')
output centralMonitorSinkSpec string = deployAzureMonitor ? 'azuremonitor://${replace(azureMonitor.outputs.centralLogsIngestionEndpoint, 'https://', '')}/${azureMonitor.outputs.centralImmutableId}?credential=managed&client_id=${identities.outputs.approver.clientId}' : ''

output consoleUrl string = deployConsole ? console.outputs.url : ''

@description('The container registry\'s name and login server (deployRegistry): az acr build --registry <name> --image se-bridge:0.1.0 --file deploy/container/Dockerfile .')
output registryName string = deployRegistry ? registry.outputs.name : ''
output registryLoginServer string = deployRegistry ? registry.outputs.loginServer : ''
