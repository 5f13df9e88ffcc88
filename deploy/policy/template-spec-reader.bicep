// Template Spec Reader on one template spec, for a policy assignment's identity: a
// DeployIfNotExists remediation deploys deploy/vm-extension.bicep from its template spec with the
// assignment's identity, which must be able to read the spec (Virtual Machine Contributor on the
// VMs' group does not reach a spec kept in another group), and nothing else.
targetScope = 'resourceGroup'

@description('Name of the template spec (in this resource group).')
param templateSpecName string

@description('Principal id of the policy assignment\'s identity.')
param principalId string

// Template Spec Reader (built-in): read access to template specs at the assigned scope.
var templateSpecReader = '392ae280-861d-42bd-9ea5-08ee6d83b80e'

resource spec 'Microsoft.Resources/templateSpecs@2022-02-01' existing = {
  name: templateSpecName
}

resource reader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(spec.id, principalId, templateSpecReader)
  scope: spec
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', templateSpecReader)
    description: 'the se-bridge install policy deploys the VM extension from this template spec'
  }
}
