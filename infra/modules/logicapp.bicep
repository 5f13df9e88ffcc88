// Example Logic App (Consumption): receives records, and for every user-initiated event that is
// Scheduled on the VM that sent the record (a reboot or redeploy a person asked for: waiting for
// NotBefore helps nobody) publishes a signed approval decision to the decisions hub.
//
// Trigger: `webhook` (the agent's webhook sink posts each record, raw or as a CloudEvent) or
// `eventhub` (the managed Event Hubs connector reads the records hub with the workflow's managed
// identity, in its own consumer group).
// Signing: the workflow language has no HMAC and a Consumption workflow's inline code takes at most
// 1,024 characters, so an HTTP action asks the signer Function (signer.bicep, ../signer/: the
// approvers' own signing code, its key in Key Vault) for the signed decision, with the function key.
// Publishing: an HTTP action sends the decision to the Event Hubs REST endpoint with the managed
// identity (audience https://eventhubs.azure.net), so no SAS key exists anywhere.

@description('Azure region.')
param location string

@description('Workflow name.')
param workflowName string

@description('URL of the signer Function (signer.bicep output signUrl).')
param signUrl string

@description('Resource id of the signer\'s function app (its function key is read with listKeys).')
param signerAppId string

@description('webhook or eventhub.')
param trigger string

@description('Resource id of the user-assigned identity the workflow runs as.')
param identityId string

@description('Event Hubs namespace host name, e.g. ns.servicebus.windows.net.')
param namespaceFqdn string

@description('Records hub (read by the eventhub trigger).')
param eventsHubName string

@description('Decisions hub (the workflow publishes there).')
param decisionsHubName string

@description('Consumer group of the eventhub trigger on the records hub.')
param consumerGroup string

@description('Seconds a decision stays valid.')
param decisionTtlSeconds int

@description('Tags of every resource.')
param tags object

var useEventHubTrigger = trigger == 'eventhub'

var webhookTrigger = {
  record: {
    type: 'Request'
    kind: 'Http'
    inputs: {
      method: 'POST'
      schema: {}
    }
  }
}

var eventHubTrigger = {
  record: {
    type: 'ApiConnection'
    recurrence: {
      frequency: 'Minute'
      interval: 1
    }
    splitOn: '@triggerBody()'
    inputs: {
      host: {
        connection: {
          name: '@parameters(\'$connections\')[\'eventhubs\'][\'connectionId\']'
        }
      }
      method: 'get'
      path: '/@{encodeURIComponent(\'${eventsHubName}\')}/events/batch/head'
      queries: {
        consumerGroupName: consumerGroup
        contentType: 'application/json'
        maximumEventsCount: 50
      }
    }
  }
}

// A webhook may deliver the record itself or a structured CloudEvent whose `data` is the record.
var recordExpression = useEventHubTrigger ? '@triggerBody()?[\'ContentData\']' : '@if(equals(triggerBody()?[\'specversion\'], null), triggerBody(), triggerBody()?[\'data\'])'

var actions = {
  Record: {
    type: 'Compose'
    inputs: recordExpression
    runAfter: {}
  }
  User_events: {
    type: 'Query'
    inputs: {
      from: '@coalesce(outputs(\'Record\')?[\'events\'], json(\'[]\'))'
      where: '@and(equals(item()?[\'eventSource\'], \'User\'), equals(item()?[\'eventStatus\'], \'Scheduled\'), equals(item()?[\'affectsThisVm\'], true))'
    }
    runAfter: {
      Record: [
        'Succeeded'
      ]
    }
  }
  For_each_event: {
    type: 'Foreach'
    foreach: '@body(\'User_events\')'
    actions: {
      Decision_fields: {
        type: 'Compose'
        inputs: {
          decisionId: '@{concat(\'la-\', items(\'For_each_event\')?[\'eventId\'], \'-\', outputs(\'Record\')?[\'vm\']?[\'name\'])}'
          eventId: '@{items(\'For_each_event\')?[\'eventId\']}'
          target: '@{outputs(\'Record\')?[\'vm\']?[\'name\']}'
          issuedBy: 'logicapp:${workflowName}'
          ttlSeconds: decisionTtlSeconds
          reason: '@{concat(\'user-initiated \', items(\'For_each_event\')?[\'eventType\'])}'
        }
        runAfter: {}
      }
      Sign_decision: {
        type: 'Http'
        inputs: {
          method: 'POST'
          uri: signUrl
          headers: {
            'Content-Type': 'application/json'
            'x-functions-key': '@parameters(\'signerKey\')'
          }
          body: '@outputs(\'Decision_fields\')'
        }
        runtimeConfiguration: {
          secureData: {
            properties: [
              'inputs'
            ]
          }
        }
        runAfter: {
          Decision_fields: [
            'Succeeded'
          ]
        }
      }
      Publish_decision: {
        type: 'Http'
        inputs: {
          method: 'POST'
          uri: 'https://${namespaceFqdn}/${decisionsHubName}/messages?timeout=60&api-version=2014-01'
          headers: {
            'Content-Type': 'application/atom+xml;type=entry;charset=utf-8'
            BrokerProperties: '@{concat(\'{"PartitionKey":"\', outputs(\'Decision_fields\')?[\'target\'], \'"}\')}'
          }
          body: '@body(\'Sign_decision\')'
          authentication: {
            type: 'ManagedServiceIdentity'
            identity: identityId
            audience: 'https://eventhubs.azure.net'
          }
        }
        runAfter: {
          Sign_decision: [
            'Succeeded'
          ]
        }
      }
    }
    runAfter: {
      User_events: [
        'Succeeded'
      ]
    }
  }
}

resource eventHubsConnection 'Microsoft.Web/connections@2016-06-01' = if (useEventHubTrigger) {
  name: '${workflowName}-eventhubs'
  location: location
  tags: tags
  properties: {
    displayName: 'se-bridge records (managed identity)'
    api: {
      id: subscriptionResourceId('Microsoft.Web/locations/managedApis', location, 'eventhubs')
    }
    // Microsoft's documented form for a managed-identity API connection ("Authenticate access with
    // managed identities", Logic Apps); the 2016-06-01 type definition lacks it (Bicep warns BCP037).
    #disable-next-line BCP037
    parameterValueSet: {
      name: 'managedIdentityAuth'
      values: {
        namespaceEndpoint: {
          value: 'sb://${namespaceFqdn}/'
        }
      }
    }
  }
}

resource workflow 'Microsoft.Logic/workflows@2019-05-01' = {
  name: workflowName
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    state: 'Enabled'
    definition: {
      '$schema': 'https://schema.management.azure.com/providers/Microsoft.Logic/schemas/2016-06-01/workflowdefinition.json#'
      contentVersion: '1.0.0.0'
      parameters: {
        '$connections': {
          type: 'Object'
          defaultValue: {}
        }
        signerKey: {
          type: 'SecureString'
        }
      }
      triggers: useEventHubTrigger ? eventHubTrigger : webhookTrigger
      actions: actions
      outputs: {}
    }
    parameters: {
      '$connections': {
        value: useEventHubTrigger ? {
          eventhubs: {
            connectionId: eventHubsConnection.id
            connectionName: eventHubsConnection.name
            id: subscriptionResourceId('Microsoft.Web/locations/managedApis', location, 'eventhubs')
            connectionProperties: {
              authentication: {
                type: 'ManagedServiceIdentity'
                identity: identityId
              }
            }
          }
        } : {}
      }
      signerKey: {
        value: listKeys('${signerAppId}/host/default', '2023-12-01').functionKeys.default
      }
    }
  }
}

@description('Workflow resource id (get the webhook URL with listCallbackUrl: it holds a signature, so it is not an output).')
output workflowId string = workflow.id

@description('Trigger name, for listCallbackUrl.')
output triggerName string = 'record'
