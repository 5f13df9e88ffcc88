// The `scheduledEventsPolicy` block of a VM or scale set (Microsoft.Compute 2024-03-01 and later), or of
// an availability set (2024-07-01 and later; the templates pin 2024-07-01): publish Scheduled Events to
// Event Grid and Azure Resource Graph as well as IMDS (issue 12, a preview: the subscription needs the
// feature Microsoft.Compute/SendScheduledEventsPolicy), and whether user-initiated reboots and
// redeploys are approved by the platform itself. A scale set's or availability set's members share its
// policy: set it on the parent. From Compute 2025-04-01, the schema version Event Grid delivers and
// the approval of events that take every instance down (issue 25) can be set too; the schema version
// is set by default (issue 34), so a resource given this policy uses Compute 2025-04-01 or later. The
// subscription needs the preview features Microsoft.Compute/SendScheduledEventsPolicy and (Microsoft's
// current preview page) Microsoft.Maintenance/ScheduledEventsActivity: the script below checks both.
//
// Use it where the VM or scale set is *defined* (a property of the resource you deploy):
//
//   module sePolicy 'modules/scheduled-events-policy.bicep' = { name: 'se-policy' }
//   resource vm 'Microsoft.Compute/virtualMachines@2025-04-01' = {
//     ...
//     properties: { ..., scheduledEventsPolicy: sePolicy.outputs.policy }
//   }
//
// VMs and scale sets that exist already are not redeployed from here (a PUT needs the whole model):
// deploy/enable-scheduled-events-policy.sh sets the same block on them with `az vm update` /
// `az vmss update` (read, change, write back), as docs/approvals.md describes.
targetScope = 'resourceGroup'

@description('Publish this VM\'s Scheduled Events to Event Grid and Azure Resource Graph (the events stay on IMDS too).')
param publishToEventGridAndResourceGraph bool = true

@description('Let the platform approve user-initiated reboots at once (no Scheduled event to approve). Off: the agent and its approvers decide.')
param autoApproveUserReboot bool = false

@description('Let the platform approve user-initiated redeploys at once. Off: the agent and its approvers decide.')
param autoApproveUserRedeploy bool = false

// During the preview, 2020-07-01 is the only schema version Event Grid delivers (Microsoft's preview
// page): the default, and any other is refused before deploying (issue 34).
@description('Compute 2025-04-01 and later: the Scheduled Events schema version Event Grid delivers; during the preview only 2020-07-01 (the Azure channel\'s reader parses it). Empty: not set (for a resource pinned to an older api-version, which refuses the property).')
@allowed([
  '2020-07-01'
  ''
])
param scheduledEventsApiVersion string = '2020-07-01'

@description('Compute 2025-04-01 and later: let the platform approve an event that takes every instance down at once (Azure\'s default: true). Empty: not set; otherwise \'true\' or \'false\'.')
@allowed([
  ''
  'true'
  'false'
])
param autoApproveAllInstancesDown string = ''

var targets = union({
  enable: publishToEventGridAndResourceGraph
}, empty(scheduledEventsApiVersion) ? {} : {
  scheduledEventsApiVersion: scheduledEventsApiVersion
})

var policy = union({
  scheduledEventsAdditionalPublishingTargets: {
    eventGridAndResourceGraph: targets
  }
  userInitiatedReboot: {
    automaticallyApprove: autoApproveUserReboot
  }
  userInitiatedRedeploy: {
    automaticallyApprove: autoApproveUserRedeploy
  }
}, empty(autoApproveAllInstancesDown) ? {} : {
  allInstancesDown: {
    automaticallyApprove: autoApproveAllInstancesDown == 'true'
  }
})

@description('The scheduledEventsPolicy object for properties.scheduledEventsPolicy of a VM or scale set.')
output policy object = policy
