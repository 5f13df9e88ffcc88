// The `scheduledEventsPolicy` block of a VM or scale set (Microsoft.Compute 2024-03-01 and later; the
// templates pin 2024-07-01): publish Scheduled Events to Event Grid and Azure Resource Graph as well as
// IMDS (issue 12), and whether user-initiated reboots and redeploys are approved by the platform itself.
//
// Use it where the VM or scale set is *defined* (a property of the resource you deploy):
//
//   module sePolicy 'modules/scheduled-events-policy.bicep' = { name: 'se-policy' }
//   resource vm 'Microsoft.Compute/virtualMachines@2024-07-01' = {
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

var policy = {
  scheduledEventsAdditionalPublishingTargets: {
    eventGridAndResourceGraph: {
      enable: publishToEventGridAndResourceGraph
    }
  }
  userInitiatedReboot: {
    automaticallyApprove: autoApproveUserReboot
  }
  userInitiatedRedeploy: {
    automaticallyApprove: autoApproveUserRedeploy
  }
}

@description('The scheduledEventsPolicy object for properties.scheduledEventsPolicy of a VM or scale set.')
output policy object = policy
