"""ticdc-applier: apply a TiCDC Open Protocol stream from Kafka to a MySQL-compatible database.

Importing this package must stay cheap and must never import pyspark: the daemon, the CLI and
the tests all import it, and only ``applier catchup`` needs Spark.
"""

__version__ = "0.1.0"
