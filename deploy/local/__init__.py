"""Run Serentak on one machine: etcd + the three services."""
