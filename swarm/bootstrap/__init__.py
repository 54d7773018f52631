"""Cloud-init bootstrap: the user-data script that puts an artifact on a new instance."""
