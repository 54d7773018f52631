"""Seeders: processes whose job is to hold artifacts and serve them to the fleet."""
