"""AWS: EC2 Fleet (instant) launches from launch templates, the VPC/subnet/security-group discovery
(``network``), IMDSv2 user data. Imports the shared provisioner, its boot package and pricing; boto3
only inside functions (``spotwise[aws]``)."""
