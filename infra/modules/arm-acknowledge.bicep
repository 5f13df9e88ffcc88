// The fleet approver's ARM path (docs/approvals.md, "When no agent can be reached"): its identity may
// acknowledge scheduled events in this resource group, nothing else.
//
// Role: the built-in "Scheduled Events Contributor" (b67fe603-310e-4889-b9ee-8257d09d353d): the action
// Microsoft.Maintenance/scheduledevents/acknowledge/action plus read on virtual machines, scale sets and
// availability sets. No built-in or custom role grants less and still lets ARM resolve the scope.
// Deployed once per resource group that holds VMs the approver serves (main.bicep's
// armAcknowledgeResourceGroups), so the grant never reaches the whole subscription.
targetScope = 'resourceGroup'

@description('Principal id of the fleet approver\'s managed identity.')
param approverPrincipalId string

var scheduledEventsContributor = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'b67fe603-310e-4889-b9ee-8257d09d353d')

resource approverAcknowledges 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, approverPrincipalId, scheduledEventsContributor)
  properties: {
    principalId: approverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: scheduledEventsContributor
    description: 'se-bridge fleet approver acknowledges scheduled events through ARM when no agent answers'
  }
}
