"""GCP: Spot and standard VMs through ``google-cloud-compute`` (``cloud``) and the node identity a VM
runs as (``identity``: the service account and what it may reach). Imports the shared provisioner, its
boot package and pricing; the Google SDK only inside functions (``spotwise[gcp]``)."""
