"""Reads ebb's replies (docs/guides/payloads.md, "Replies") with the official Azure Storage Queues
SDK for Python, as a producer waiting for answers would:

  replies.py <connection string> <reply queue> <count>

Receives up to <count> messages (waiting up to 30 s) with the SDK's base64 decode policy
(the queue's default encoding in ebb), deletes them, and prints each reply as one JSON line:
correlation_id, item (or null) and the answer's text.
"""
import base64
import json
import sys
import time

from azure.storage.queue import BinaryBase64DecodePolicy, QueueClient

# The storage API version ebb speaks (Azurite 3.37 refuses newer ones).
API_VERSION = "2026-04-06"


def answer(reply):
    """The answer's bytes: `body` when it was UTF-8, else `body_base64`."""
    if "body" in reply:
        return reply["body"].encode("utf-8")
    return base64.b64decode(reply.get("body_base64", ""))


def main():
    connection_string, queue, wanted = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = QueueClient.from_connection_string(
        connection_string, queue, api_version=API_VERSION, message_decode_policy=BinaryBase64DecodePolicy()
    )
    deadline, seen = time.time() + 30, 0
    while seen < wanted and time.time() < deadline:
        batch = min(32, wanted - seen)
        for message in client.receive_messages(messages_per_page=batch, max_messages=batch):
            reply = json.loads(message.content)
            print(json.dumps({"correlation_id": reply["correlation_id"], "item": reply.get("item"),
                              "answer": answer(reply).decode("utf-8", "replace")}))
            client.delete_message(message)
            seen += 1
        if seen < wanted:
            time.sleep(0.2)


if __name__ == "__main__":
    main()
