"""What crosses the wire, shared by the broker, the controller and the clients: record codecs
and content negotiation (`codecs`), the HTTP status of each error code (`errors`), the one
error middleware of the broker and the controller (`middleware`), and the key -> partition
rule (`partitioner`, also shipped to Spark executors, so this package imports nothing at
import time)."""
