// Azure Monitor as a destination of the bridge (issue 26, docs/azure-monitor.md): the custom tables, a
// Direct data collection rule whose own logsIngestion endpoint the agents' azuremonitor:// sink posts to,
// Monitoring Metrics Publisher on that rule for the identities that send, a workbook for the fleet, two
// alert rules and the action group that tells a person. Deployed in the workspace's resource group; the
// rule in the workspace's region. Streams, tables and columns come from schemas/logs-ingestion.v1.json,
// the file the sink reads too (declared once); the KQL texts from infra/monitor/, checked by
// tests/integration/test_kql.py with Microsoft's Kusto language service.

@description('Name of the Log Analytics workspace (in this resource group).')
param workspaceName string

@description('Region of the workspace (a data collection rule sends to workspaces of its own region).')
param location string

@description('Name of the data collection rule.')
param ruleName string

@description('Principals (object ids) of the agents: they may send to the agents\' rule, whose only stream is the records table (issue 34: one rule for all let a compromised VM write approvals and findings, and silence the "unapproved" alert fleet-wide).')
param agentPrincipalIds array

@description('Principals (object ids) of the central services (fleet approvers, Azure\'s channel): they may send to the central rule (records, approvals, findings).')
param centralPrincipalIds array

@description('Days the tables keep records (Analytics plan: 4-730).')
@minValue(4)
@maxValue(730)
param retentionDays int = 90

@description('Alert when an event starts within this many minutes and nothing approved it or prepared its VM.')
@minValue(5)
@maxValue(1440)
param alertHorizonMinutes int = 30

// At most as many receivers of each kind as an action group takes (Azure Monitor service limits,
// action groups: email 1 000, SMS, app push, webhook and Logic App 10 each): refused before deploying.
@description('Email addresses the action group notifies (empty: no email receiver).')
@maxLength(1000)
param alertEmails array = []

@description('SMS receivers of the action group, [{countryCode, phoneNumber}].')
@maxLength(10)
param alertSms array = []

@description('Azure mobile app push receivers, [email addresses of Azure accounts].')
@maxLength(10)
param alertPush array = []

@description('Webhook receivers, [{name, serviceUri}] (a Logic App trigger, a chat bridge). Azure keeps the URI in the action group and the deployment records the parameter: use a URI whose secret can be rotated, or an email / Logic App without a secret in its address.')
@maxLength(10)
param alertWebhooks array = []

@description('Logic App receivers, [{name, resourceId, callbackUrl}] (a workflow that posts to Teams, opens a ticket...); the callback URL carries the trigger\'s signature: same caveat as the webhooks.')
@maxLength(10)
param alertLogicApps array = []

@description('Tags of every resource.')
param tags object

var layout = loadJsonContent('../../schemas/logs-ingestion.v1.json')
var tableNames = [for stream in items(layout.streams): stream.value.table]
var tableColumns = [for column in layout.columns: {
  name: column.name
  type: column.type == 'datetime' ? 'dateTime' : column.type
  description: contains(column, 'description') ? column.description : ''
}]
var streamColumns = [for column in layout.columns: {
  name: column.name
  type: column.type
}]
var logAnalyticsReader = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '73c42c96-874c-492b-b04d-ab87d138a893')
var monitoringMetricsPublisher = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '3913510d-42f4-4e42-8a64-420c390055eb')
// The most an alert rule may look back (overrideQueryTimeRange's maximum); the queries' inventory.
var queryTimeRange = 'P2D'
var unapprovedQuery = replace(loadTextContent('../monitor/alert-unapproved.kql'), 'let horizon = 30m;', 'let horizon = ${alertHorizonMinutes}m;')

resource workspace 'Microsoft.OperationalInsights/workspaces@2025-07-01' existing = {
  name: workspaceName
}

resource tables 'Microsoft.OperationalInsights/workspaces/tables@2025-07-01' = [for name in tableNames: {
  parent: workspace
  name: name
  properties: {
    plan: 'Analytics'
    retentionInDays: retentionDays
    schema: {
      name: name
      columns: tableColumns
    }
  }
}]

// Two rules, one per kind of sender (issue 34). The agents' has the records stream alone: what an agent
// may write (its own scheduledEvents, heartbeats, preparations and impacts). Approvals and findings
// come only through the central rule, whose senders are the fleet approvers and Azure's channel: a
// compromised VM cannot write an approval that silences the "unapproved" alert, nor fabricate a finding.
var centralStreams = [for stream in items(layout.streams): stream.key]
var agentStreams = [
  'Custom-SeBridgeRecords'
]

resource rule 'Microsoft.Insights/dataCollectionRules@2024-03-11' = {
  name: ruleName
  // A data collection rule sends only to workspaces of its own region (issue 34): the workspace's,
  // whatever region the deployment was given.
  location: workspace.location
  kind: 'Direct'
  tags: tags
  dependsOn: [
    tables
  ]
  properties: {
    description: 'scheduled-events-bridge agents\' records (azuremonitor:// sink): the records stream only'
    streamDeclarations: {
      'Custom-SeBridgeRecords': {
        columns: streamColumns
      }
    }
    destinations: {
      logAnalytics: [
        {
          name: 'workspace'
          workspaceResourceId: workspace.id
        }
      ]
    }
    dataFlows: [for stream in agentStreams: {
      streams: [
        stream
      ]
      destinations: [
        'workspace'
      ]
      transformKql: layout.transformKql
      outputStream: 'Custom-${layout.streams[stream].table}'
    }]
  }
}

resource centralRule 'Microsoft.Insights/dataCollectionRules@2024-03-11' = {
  name: '${ruleName}-central'
  location: workspace.location
  kind: 'Direct'
  tags: tags
  dependsOn: [
    tables
  ]
  properties: {
    description: 'scheduled-events-bridge central services (azuremonitor:// sink): records, approvals, findings'
    streamDeclarations: {
      'Custom-SeBridgeRecords': {
        columns: streamColumns
      }
      'Custom-SeBridgeApprovals': {
        columns: streamColumns
      }
      'Custom-SeBridgeFindings': {
        columns: streamColumns
      }
    }
    destinations: {
      logAnalytics: [
        {
          name: 'workspace'
          workspaceResourceId: workspace.id
        }
      ]
    }
    dataFlows: [for stream in centralStreams: {
      streams: [
        stream
      ]
      destinations: [
        'workspace'
      ]
      transformKql: layout.transformKql
      outputStream: 'Custom-${layout.streams[stream].table}'
    }]
  }
}

// Sending needs Monitoring Metrics Publisher on the rule itself (nothing wider).
resource publishers 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principalId in agentPrincipalIds: {
  name: guid(rule.id, principalId, monitoringMetricsPublisher)
  scope: rule
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: monitoringMetricsPublisher
  }
}]

resource centralPublishers 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principalId in centralPrincipalIds: {
  name: guid(centralRule.id, principalId, monitoringMetricsPublisher)
  scope: centralRule
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: monitoringMetricsPublisher
  }
}]

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, ruleName, 'se-bridge-workbook')
  location: location
  kind: 'shared'
  tags: tags
  properties: {
    // Unique in the resource group (two deployments there, two workbooks: the same display name is refused).
    displayName: 'Scheduled Events across the fleet (${ruleName})'
    category: 'workbook'
    sourceId: workspace.id
    serializedData: loadTextContent('../monitor/workbook.json')
  }
}

resource actionGroup 'Microsoft.Insights/actionGroups@2022-06-01' = {
  name: '${ruleName}-oncall'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'se-bridge'
    enabled: true
    emailReceivers: [for (email, i) in alertEmails: {
      name: 'email-${i}'
      emailAddress: email
      useCommonAlertSchema: true
    }]
    smsReceivers: [for (sms, i) in alertSms: {
      name: 'sms-${i}'
      countryCode: sms.countryCode
      phoneNumber: sms.phoneNumber
    }]
    azureAppPushReceivers: [for (account, i) in alertPush: {
      name: 'push-${i}'
      emailAddress: account
    }]
    logicAppReceivers: [for app in alertLogicApps: {
      name: app.name
      resourceId: app.resourceId
      callbackUrl: app.callbackUrl
      useCommonAlertSchema: true
    }]
    webhookReceivers: [for hook in alertWebhooks: {
      name: hook.name
      serviceUri: hook.serviceUri
      useCommonAlertSchema: true
    }]
  }
}

resource unapproved 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  // Azure validates a rule's query when it is created: the custom tables it reads must exist first,
  // or the first deployment fails with "Failed to resolve table" (issue 34).
  dependsOn: [
    tables
  ]
  name: '${ruleName}-unapproved-maintenance'
  location: location
  tags: tags
  // The rule queries the workspace as itself (Log Analytics Reader on the workspace, below), not as
  // whoever last edited it: a person leaving the team does not silence the alert.
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    displayName: 'Maintenance within ${alertHorizonMinutes} minutes that nothing approved or prepared'
    severity: 1
    enabled: true
    scopes: [
      workspace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    // What the query reads: 2 days, the most a rule may look back (the default is windowSize, in
    // which a silence or an event announced days ahead leaves nothing to find; issue 34).
    overrideQueryTimeRange: queryTimeRange
    criteria: {
      allOf: [
        {
          query: unapprovedQuery
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          // One alert per VM and event, or per wave when more than 250 (a log alert raises at most
          // 300 per evaluation): the query's Subject says which.
          dimensions: [
            {
              name: 'Subject'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

resource silent 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  // Azure validates a rule's query when it is created: the custom tables it reads must exist first,
  // or the first deployment fails with "Failed to resolve table" (issue 34).
  dependsOn: [
    tables
  ]
  name: '${ruleName}-agent-silent'
  location: location
  tags: tags
  // The rule queries the workspace as itself (Log Analytics Reader on the workspace, below), not as
  // whoever last edited it: a person leaving the team does not silence the alert.
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    displayName: 'A scheduled-events-bridge agent stopped reporting'
    severity: 2
    enabled: true
    // A dead agent stays an alert until a person closes it: past the 2 days the query reads, the VM
    // leaves the inventory and an auto-resolved alert would look like a recovery.
    autoMitigate: false
    scopes: [
      workspace.id
    ]
    evaluationFrequency: 'PT15M'
    windowSize: 'PT15M'
    // What the query reads: 2 days, the most a rule may look back (the default is windowSize, in
    // which a silence or an event announced days ahead leaves nothing to find; issue 34).
    overrideQueryTimeRange: queryTimeRange
    criteria: {
      allOf: [
        {
          query: loadTextContent('../monitor/alert-silent.kql')
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          // One alert per VM, or per resource group when more than 250 are silent at once.
          dimensions: [
            {
              name: 'Subject'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

// Each alert rule reads the workspace with its own identity.
resource unapprovedReads 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(workspace.id, unapproved.id, logAnalyticsReader)
  scope: workspace
  properties: {
    principalId: unapproved.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: logAnalyticsReader
  }
}

resource silentReads 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(workspace.id, silent.id, logAnalyticsReader)
  scope: workspace
  properties: {
    principalId: silent.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: logAnalyticsReader
  }
}

@description('The agents\' rule\'s own Logs Ingestion endpoint (kind Direct; the records stream only).')
output logsIngestionEndpoint string = rule.properties.endpoints.logsIngestion

@description('The agents\' rule\'s immutable id (the sink spec\'s path).')
output immutableId string = rule.properties.immutableId

@description('The central rule\'s Logs Ingestion endpoint (fleet approvers, Azure\'s channel).')
output centralLogsIngestionEndpoint string = centralRule.properties.endpoints.logsIngestion

@description('The central rule\'s immutable id.')
output centralImmutableId string = centralRule.properties.immutableId
