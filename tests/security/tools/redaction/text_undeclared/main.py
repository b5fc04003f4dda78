print("<html>not JSON</html>")
