"""The official Azure Storage Queues SDK for Python, as another application on the same
queue as ebb (tests/all/azure_queue.rs drives it):

  interop.py put <connection string> <queue> <encoding> <body as hex>...
  interop.py take <connection string> <queue> <encoding> <count>
  interop.py delete <connection string> <queue> <encoding>

<encoding> is `base64` (the SDK's TextBase64/BinaryBase64 policies: what Azure Functions'
queue output binding writes and its trigger reads) or `none` (the SDK's default: XML text).
`take` receives up to <count> messages (waiting up to 30 s), deletes them, and prints their
bodies as hex, one per line. `delete` deletes the queue (as an operator, or a storage
account restored empty, would remove it under a running host).
"""
import sys
import time

from azure.storage.queue import BinaryBase64DecodePolicy, BinaryBase64EncodePolicy, QueueClient


# The storage API version ebb speaks (Azurite 3.37 refuses newer ones).
API_VERSION = "2026-04-06"


def client(connection_string, queue, encoding):
    if encoding == "base64":
        return QueueClient.from_connection_string(
            connection_string,
            queue,
            api_version=API_VERSION,
            message_encode_policy=BinaryBase64EncodePolicy(),
            message_decode_policy=BinaryBase64DecodePolicy(),
        )
    return QueueClient.from_connection_string(connection_string, queue, api_version=API_VERSION)


def main():
    command, connection_string, queue, encoding = sys.argv[1:5]
    queue_client = client(connection_string, queue, encoding)
    if command == "put":
        for body in sys.argv[5:]:
            raw = bytes.fromhex(body)
            queue_client.send_message(raw if encoding == "base64" else raw.decode("utf-8"))
    elif command == "take":
        wanted, deadline, bodies = int(sys.argv[5]), time.time() + 30, []
        while len(bodies) < wanted and time.time() < deadline:
            batch = min(32, wanted - len(bodies))
            for message in queue_client.receive_messages(messages_per_page=batch, max_messages=batch):
                content = message.content
                bodies.append(content.hex() if isinstance(content, bytes) else content.encode("utf-8").hex())
                queue_client.delete_message(message)
            if len(bodies) < wanted:
                time.sleep(0.2)
        print("\n".join(bodies))
    elif command == "delete":
        queue_client.delete_queue()
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
