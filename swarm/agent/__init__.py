"""The node agent: fetches artifacts from every source into a sink and keeps them seeding."""
