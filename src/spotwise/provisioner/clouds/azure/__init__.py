"""Azure: Spot and regular VMs through ``azure-mgmt-compute`` (``cloud``) and the managed identity a VM
runs as (``identity``), the locations whose nodes have a way out (``locations``). Imports the shared provisioner, its boot package, pricing and the runtime's
storage URIs; the Azure SDKs only inside functions (``spotwise[azure]``)."""
