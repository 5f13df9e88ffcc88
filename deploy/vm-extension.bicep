// Installs and configures the Scheduled Events bridge (agent + local approver) on an existing VM or
// scale set, Linux or Windows: on a Linux VM as a managed Run Command (it coexists with a Custom Script
// extension the VM may already have), otherwise with the Custom Script extension (installWith). Deploy
// it into the resource group of the VM (or scale set) once the platform side (infra/main.bicep) exists
// and the agents' managed identity is attached to the VM (docs/deploy.md):
//
//   az deployment group create -g rg-app -f deploy/vm-extension.bicep \
//     -p vmName=vm-app-0 osType=Linux eventHubsNamespaceFqdn=... agentIdentityClientId=...
//
// Secrets (approver HMAC keys, connection strings, webhook keys, a private index URL) only ever travel
// encrypted for the VM and are never returned by the API: in the Run Command's protectedParameters,
// or in the extension's protectedSettings (on Linux the whole bootstrap, settings, secrets and
// deploy/linux/install.sh, is the protected `script`); on Windows the protected commandToExecute runs
// deploy/windows/install.ps1 with no secret on its command line (they come from Key Vault:
// windowsSecretsUri). The wheel and the Windows installer are downloaded from the artifacts container
// with the agents' managed identity (no SAS token).

@description('Operating system of the VM or scale set.')
@allowed([
  'Linux'
  'Windows'
])
param osType string = 'Linux'

@description('Name of an existing VM in this resource group (leave empty when vmssName is set).')
param vmName string = ''

@description('Name of an existing scale set in this resource group (leave empty when vmName is set). Instances pick the extension up on their next model update (az vmss update-instances).')
param vmssName string = ''

@description('Region of the VM (extensions of a VM live in its region).')
param location string = resourceGroup().location

@description('Event Hubs host name (infra output eventHubsNamespaceFqdn).')
param eventHubsNamespaceFqdn string

@description('Records hub (infra output eventsHubName).')
param eventsHubName string = 'se-records'

@description('Decisions hub (infra output decisionsHubName).')
param decisionsHubName string = 'se-decisions'

@description('Client id of the agents\' user-assigned identity (infra output agentIdentityClientId); the identity must be attached to the VM.')
param agentIdentityClientId string

@description('Publish records to the records hub (the sink eventhubs://<fqdn>/<hub>?credential=managed&client_id=<id>).')
param publishToEventHubs bool = true

@description('More sinks, e.g. file:///var/log/se-bridge/records.jsonl or a webhook https://...#format=cloudevents&hmac_key_file=/etc/se-bridge/webhook.key (its key goes in secretFiles).')
param extraSinks array = []

@description('Seconds between IMDS polls (0.1-60; IMDS recommends 1).')
param pollInterval string = '1.0'

@description('More [agent] settings (TOML keys = the agent flags with \'_\'), e.g. local approval policies: passed through as they are and validated by the installer.')
param agentSettings object = {}

@description('Install and start the local approver (decisions hub -> StartRequests through this VM\'s agent; it acts only on decisions whose target is this VM). Every local approver reads every partition of the decisions hub in one consumer group, and Event Hubs admits 5 readers per partition and consumer group: local approvers on Event Hubs are for at most 5 VMs. Default: on for a single VM, off for a scale set, whose approvals go through a fleet approver (docs/deploy.md, docs/approvals.md).')
param enableApprover bool = empty(vmssName)

@description('Approver mode: local (relay to this VM\'s agent) or fleet.')
@allowed([
  'local'
  'fleet'
])
param approverMode string = 'local'

@description('Approver source spec; empty: the decisions hub with the agents\' managed identity.')
param approverSource string = ''

@description('More [approver] settings (TOML keys = the approver flags with \'_\').')
param approverSettings object = {}

@description('Approver HMAC keys as {"<key id>": "<secret of at least 32 bytes>"}; written to /etc/se-bridge/keys/<id>.key (0600) and configured as --key.')
@secure()
param decisionKeys object = {}

@description('Environment variables for the services, e.g. {"EVENTHUBS_CONNECTION_STRING": "..."} for a sink with ?connection_string_env=EVENTHUBS_CONNECTION_STRING.')
@secure()
param secretEnvironment object = {}

@description('Secret files under /etc/se-bridge (0600), e.g. {"webhook.key": "..."} for a webhook sink with hmac_key_file=/etc/se-bridge/webhook.key.')
@secure()
param secretFiles object = {}

@description('Blob URL of the wheel in the artifacts container (infra output artifactsBaseUrl + file name); empty: install packageRequirement from the package index.')
param wheelUri string = ''

@description('pip requirement installed when wheelUri is empty.')
param packageRequirement string = 'scheduled-events-bridge'

@description('Package extras: eventhubs for the Event Hubs sink and source, keyvault for secrets read from Key Vault, all for every transport.')
param packageExtras string = 'eventhubs,keyvault'

@description('Private package index URL (may hold credentials); empty: the VM\'s pip configuration.')
@secure()
param pipIndexUrl string = ''

@description('Blob URL of deploy/windows/install.ps1 in the artifacts container (Windows only).')
param windowsInstallerUri string = ''

@description('Windows: Key Vault secret (https://<vault>.vault.azure.net/secrets/<name>) holding the install secrets as JSON ({"approverKeys": {...}, "env": {...}, "files": {...}}), read by the installer with the agents\' identity (role Key Vault Secrets User). decisionKeys, secretEnvironment, secretFiles and pipIndexUrl are Linux only: a Windows command line would carry them. Keys can also stay in Key Vault for good: settings may name https://<vault>/secrets/<name> wherever a key file goes.')
param windowsSecretsUri string = ''

@description('Change this value (e.g. a timestamp) to run the installer again with unchanged settings, e.g. to pick up a new wheel at the same URL.')
param forceUpdateTag string = ''

@description('How the installer reaches the machine. RunCommand (the default on a Linux VM): a managed Run Command, which coexists with a Custom Script extension the VM may already have (a VM takes only one of those). CustomScript: the Custom Script extension, which replaces an existing one\'s settings; the delivery for scale sets and Windows in this template (a model extension reaches every instance, new ones too). Scale sets without a Custom Script slot to spare: the VM Application (infra/modules/vm-application.bicep, docs/deploy.md).')
@allowed([
  'RunCommand'
  'CustomScript'
])
param installWith string = (osType == 'Linux' && !empty(vmName)) ? 'RunCommand' : 'CustomScript'

var recordsSink = 'eventhubs://${eventHubsNamespaceFqdn}/${eventsHubName}?credential=managed&client_id=${agentIdentityClientId}'
var sinks = concat(publishToEventHubs ? [
  recordsSink
] : [], extraSinks)
var agentTable = union({
  sink: sinks
  poll_interval: json(pollInterval)
}, agentSettings)
var decisionsSource = 'eventhubs://${eventHubsNamespaceFqdn}/${decisionsHubName}?credential=managed&client_id=${agentIdentityClientId}'
var approverTable = union({
  source: empty(approverSource) ? decisionsSource : approverSource
  mode: approverMode
}, (approverMode == 'local') ? {
  relay: 'http://127.0.0.1:8710'
} : {}, approverSettings)
var settings = enableApprover ? {
  agent: agentTable
  approver: approverTable
} : {
  agent: agentTable
}
var settingsB64 = base64(string(settings))
var secretsB64 = base64(string({
  approverKeys: decisionKeys
  env: secretEnvironment
  files: secretFiles
  pipIndexUrl: pipIndexUrl
}))
var wheelFile = empty(wheelUri) ? '' : last(split(first(split(wheelUri, '?')), '/'))
var linuxPackageArgs = empty(wheelUri) ? '--package \'${packageRequirement}\'' : '--wheel "$PWD/${wheelFile}"'
var windowsPackageArgs = empty(wheelUri) ? '-Package "${packageRequirement}"' : '-Wheel "${wheelFile}"'
var downloads = concat(empty(wheelUri) ? [] : [
  wheelUri
], (osType == 'Windows') ? [
  windowsInstallerUri
] : [])

// The Linux bootstrap: the settings and secrets as environment variables, the installer's arguments,
// then the installer itself. It runs with /bin/sh in the directory the extension downloaded into.
var linuxScript = join([
  '#!/bin/sh'
  '# se-bridge VM extension bootstrap, generated by deploy/vm-extension.bicep'
  'SE_BRIDGE_INSTALL_SETTINGS_B64=\'${settingsB64}\''
  'SE_BRIDGE_INSTALL_SECRETS_B64=\'${secretsB64}\''
  'export SE_BRIDGE_INSTALL_SETTINGS_B64 SE_BRIDGE_INSTALL_SECRETS_B64'
  'set -- --force-config --extras \'${packageExtras}\' ${linuxPackageArgs}'
  loadTextContent('linux/install.sh')
], '\n')

// Windows: no secret on the command line (process-creation auditing records it); the installer reads
// them from Key Vault (windowsSecretsUri) with the agents' identity.
var windowsSecretsArgs = empty(windowsSecretsUri) ? '' : '-SecretsUri "${windowsSecretsUri}" -IdentityClientId ${agentIdentityClientId}'
// The Linux installer as a managed Run Command (Linux VMs): the run-command handler sets each named
// parameter as an environment variable of the script (protected ones from the encrypted protected
// settings) and runs it with /bin/bash; install.sh reads its settings and secrets from those variables
// and downloads the wheel itself with the agents' identity (--download-identity).
var useRunCommand = installWith == 'RunCommand' && osType == 'Linux' && !empty(vmName)
var runCommandPackageArgs = empty(wheelUri) ? '--package \'${packageRequirement}\'' : '--wheel \'${wheelUri}\' --download-identity ${agentIdentityClientId}'
var runCommandScript = join([
  '#!/bin/sh'
  '# se-bridge installer, delivered as a managed Run Command by deploy/vm-extension.bicep'
  'set -- --force-config --extras \'${packageExtras}\' ${runCommandPackageArgs}'
  loadTextContent('linux/install.sh')
], '\n')

var windowsCommand = 'powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -File install.ps1 -SettingsB64 ${settingsB64} ${windowsSecretsArgs} -ForceConfig -Extras "${packageExtras}" ${windowsPackageArgs}'

var downloadIdentity = empty(downloads) ? {} : {
  fileUris: downloads
  managedIdentity: {
    clientId: agentIdentityClientId
  }
}

var linuxProperties = {
  publisher: 'Microsoft.Azure.Extensions'
  type: 'CustomScript'
  typeHandlerVersion: '2.1'
  autoUpgradeMinorVersion: true
  forceUpdateTag: forceUpdateTag
  settings: {}
  protectedSettings: union({
    script: base64(linuxScript)
  }, downloadIdentity)
}

var windowsProperties = {
  publisher: 'Microsoft.Compute'
  type: 'CustomScriptExtension'
  typeHandlerVersion: '1.10'
  autoUpgradeMinorVersion: true
  forceUpdateTag: forceUpdateTag
  settings: {}
  protectedSettings: union({
    commandToExecute: windowsCommand
  }, downloadIdentity)
}

resource vm 'Microsoft.Compute/virtualMachines@2024-07-01' existing = {
  name: vmName
}

resource vmss 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' existing = {
  name: vmssName
}

resource vmRunCommand 'Microsoft.Compute/virtualMachines/runCommands@2024-07-01' = if (useRunCommand) {
  parent: vm
  name: 'se-bridge-install'
  location: location
  properties: {
    source: {
      script: runCommandScript
    }
    parameters: [
      {
        name: 'SE_BRIDGE_INSTALL_SETTINGS_B64'
        value: settingsB64
      }
      {
        name: 'SE_BRIDGE_INSTALL_RUN'
        value: empty(forceUpdateTag) ? 'once' : forceUpdateTag
      }
    ]
    protectedParameters: [
      {
        name: 'SE_BRIDGE_INSTALL_SECRETS_B64'
        value: secretsB64
      }
    ]
    timeoutInSeconds: 1800
    asyncExecution: false
    treatFailureAsDeploymentFailure: true
  }
}

resource vmExtension 'Microsoft.Compute/virtualMachines/extensions@2024-07-01' = if (!empty(vmName) && !useRunCommand) {
  parent: vm
  name: 'se-bridge'
  location: location
  properties: (osType == 'Linux') ? linuxProperties : windowsProperties
}

resource vmssExtension 'Microsoft.Compute/virtualMachineScaleSets/extensions@2024-07-01' = if (!empty(vmssName)) {
  parent: vmss
  name: 'se-bridge'
  properties: (osType == 'Linux') ? linuxProperties : windowsProperties
}

@description('The settings the installer renders into config.toml (no secrets).')
output settings object = settings

@description('Sinks the agent is configured with.')
output sinks array = sinks
