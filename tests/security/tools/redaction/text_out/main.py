print("plain text, not JSON")
