"""The translation page of nmt_tf.serve (nmt_tf.serving.page): its files over HTTP,
and the page driven in a real headless Chromium (Debian's chromium and
chromium-driver, which .ci/run installs): a sentence in, the translation,
n-best list and heatmap out, hover links, and a message for every failure."""

import functools
import os
import re
import shutil
import urllib.error
import urllib.request

import pytest

from nmt_tf.inference.client import SignatureClient
from nmt_tf.serving import page
from nmt_tf.serving import rest as rest_api
from nmt_tf.serving import server as nmt_server
from nmt_tf.serving.http_server import RestSettings

SENTENCE = "A man in a blue shirt is running."


def start(exported, tmp_path_factory, name="nmt"):
    """An nmt_tf.serve (gRPC and REST) of the tiny export: (grpc server, registry, REST server)."""
    base = str(tmp_path_factory.mktemp("page") / "nmt")
    shutil.copytree(exported[1], base)
    srv, registry, _ = nmt_server.start_server(name, base, port=0, host="127.0.0.1", threads=2, log=lambda *a: None)
    return srv, registry, rest_api.start_rest_server(registry, RestSettings(host="127.0.0.1", threads=2))


def stop(servers):
    srv, registry, rest = servers
    rest.stop()
    registry.stop()
    srv.stop(grace=0)


@pytest.fixture(scope="module")
def server(exported, tmp_path_factory):
    servers = start(exported, tmp_path_factory)
    yield f"http://127.0.0.1:{servers[2].port}"
    stop(servers)


def fetch(url, method="GET", data=None):
    """(status, headers, body) of one request."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=30) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_the_page_files_are_served_with_their_types_and_a_strict_policy(server):
    status, headers, body = fetch(server + "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"
    assert b'data-model-name="nmt"' in body and b'data-max-input-tokens="20"' in body and b"{{" not in body
    assert b"English" in body and b"French" in body and b"RNNsearch with attention (Bahdanau et al. 2015)" in body
    for path, kind in (("/page/app.js", "text/javascript"), ("/page/style.css", "text/css")):
        status, headers, body = fetch(server + path)
        assert status == 200 and headers["Content-Type"].startswith(kind) and len(body) > 500
    status, headers, body = fetch(server + "/", method="HEAD")
    assert status == 200 and body == b""
    for method, path in (("POST", "/"), ("GET", "/page/missing.js"), ("GET", "/index.html")):
        status, headers, body = fetch(server + path, method=method, data=b"{}" if method == "POST" else None)
        assert status == 404 and headers["Content-Type"] == "application/json", (method, path)


def test_what_the_page_shows_of_the_model_is_escaped():
    html = page.index_html('<script>"x"', {"src_lang": "en", "tgt_lang": "x<y", "model": "rnnsearch"}, 3).decode()
    assert "<script>\"x\"" not in html and "&lt;script&gt;&quot;x&quot;" in html and "x&lt;y" in html


def test_the_page_names_the_served_architecture():
    from nmt_tf.models import RNNEncDecConfig, RNNSearchConfig

    about = lambda config: re.search(r'<p class="about">(.*?)</p>', page.index_html(
        "nmt", {"src_lang": "en", "tgt_lang": "fr", "architecture": config.describe()}, 1).decode(), re.S).group(1)
    assert "RNNsearch with attention (Bahdanau et al. 2015) · beam search" in about(RNNSearchConfig())
    assert ("RNNsearch with attention (Bahdanau et al. 2015), a conditional GRU decoder (Sennrich et al. 2017), "
            "2 encoder layers · beam search") in about(RNNSearchConfig(decoder="cgru", encoder_layers=2))
    assert ("a conditional GRU decoder (Sennrich et al. 2017) with a deep transition of 3 GRUs · beam"
            in about(RNNSearchConfig(decoder="cgru", decoder_transition_depth=3)))
    assert "RNNencdec (Cho et al. 2014a), no attention · beam" in about(RNNEncDecConfig())
    grconv = RNNEncDecConfig(encoder="grconv")
    assert "RNNencdec with a grConv encoder (Cho et al. 2014b), no attention" in about(grconv)
    older = page.index_html("nmt", {"src_lang": "en", "tgt_lang": "fr", "model": "rnnsearch"}, 1).decode()
    assert "· rnnsearch · beam search" in older          # an export made before nmt_tf.json named it


def test_a_server_without_the_page_answers_its_path_as_the_rest_api(exported, tmp_path_factory):
    srv, registry, rest = start(exported, tmp_path_factory)
    rest.stop()
    bare = rest_api.start_rest_server(registry, RestSettings(host="127.0.0.1", threads=2, page=False))
    try:
        status, headers, _ = fetch(f"http://127.0.0.1:{bare.port}/")
        assert status == 404 and headers["Content-Type"] == "application/json"
    finally:
        bare.stop()
        registry.stop()
        srv.stop(grace=0)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Selenium, with Debian's chromium and chromedriver
    (never a downloaded driver). Missing outside CI: skipped; in CI: an error."""
    if os.environ.get("CI"):
        from selenium import webdriver
    else:
        webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (binary and driver_path):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are needed (.ci/run installs Debian's chromium and chromium-driver)")
        pytest.skip("no chromium / chromedriver here (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,1200"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()


def load(browser, url):
    """Opens the page and waits until it has loaded whole, its script too:
    chromedriver's get() now and then returns while the document is still
    loading (seen with Chromium 156), and a form submitted before app.js
    runs is an ordinary form submission."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    WebDriverWait(browser, 30).until(
        lambda b: b.execute_script("return document.readyState === 'complete' && location.href === arguments[0]", url))


def submit(browser, url, text):
    """Loads the page, types `text` and presses Enter; waits for a result or a message."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    load(browser, url)
    box = browser.find_element(By.ID, "source")
    browser.execute_script("arguments[0].value = arguments[1];", box, text)     # long lines fast
    box.send_keys(Keys.END, Keys.ENTER)
    shown = lambda b: (not b.find_element(By.ID, "result").get_attribute("hidden")
                       or not b.find_element(By.ID, "message").get_attribute("hidden"))
    WebDriverWait(browser, 60).until(shown)
    return browser


def test_a_sentence_is_translated_with_its_nbest_list_and_heatmap(server, browser, exported):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    submit(browser, server + "/", SENTENCE)
    expected = SignatureClient(saved_model=exported[2])(text=[SENTENCE])
    source_tokens = [t for t in expected["source_tokens"][0] if t]
    target_tokens = [t for t in expected["target_tokens"][0] if t]
    assert browser.find_element(By.ID, "message").get_attribute("hidden")
    written = expected["translation"][0].decode().strip() or "(the model wrote nothing)"
    assert browser.find_element(By.ID, "translation").text == written
    assert len(browser.find_elements(By.CSS_SELECTOR, "#heatmap td.cell")) == len(source_tokens) * len(target_tokens)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#heatmap thead th")) == len(source_tokens) + 1
    assert len(browser.find_elements(By.CSS_SELECTOR, "#nbest li")) == sum(s > -1e8 for s in expected["nbest_scores"][0])
    assert "ms from pressing Enter" in browser.find_element(By.ID, "timing").text
    assert browser.find_element(By.ID, "confidence").get_attribute("hidden")        # no calibrator, no line
    row = browser.find_elements(By.CSS_SELECTOR, "#heatmap tbody th")[0]
    ActionChains(browser).move_to_element(row).perform()
    assert "active" in row.get_attribute("class")
    assert browser.find_elements(By.CSS_SELECTOR, "#heatmap thead th.linked")      # its source tokens
    column = browser.find_elements(By.CSS_SELECTOR, "#heatmap thead th")[1]
    ActionChains(browser).move_to_element(column).perform()
    assert not browser.find_elements(By.CSS_SELECTOR, "#heatmap thead th.linked")
    assert "active" in column.get_attribute("class")
    assert browser.find_elements(By.CSS_SELECTOR, "#heatmap tbody th.linked")      # the outputs attending to it
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors          # no script error, nothing refused by the page's policy, no missing file


def test_a_chosen_beam_is_asked_for_and_its_translation_shown(server, browser, exported):
    """Issue 91: the page offers the beams of the export's
    translate_with_options (1 to 3 here, 3 the served default); with one
    chosen, the request asks for it (markup and protect still work) and the
    page shows that search's translation and n-best list."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    load(browser, server + "/")
    assert not browser.find_element(By.ID, "beam-option").get_attribute("hidden")
    choice = Select(browser.find_element(By.ID, "beam"))
    assert [o.text for o in choice.options] == ["1", "2", "3 (served default)"]
    choice.select_by_visible_text("1")
    browser.find_element(By.ID, "markup").click()
    browser.find_element(By.ID, "source").send_keys("A <b>man</b> in a blue shirt.")
    browser.find_element(By.ID, "submit").click()
    WebDriverWait(browser, 60).until(lambda b: not b.find_element(By.ID, "result").get_attribute("hidden")
                                     or not b.find_element(By.ID, "message").get_attribute("hidden"))
    assert browser.find_element(By.ID, "result").get_attribute("hidden") is None, \
        browser.find_element(By.ID, "message").text
    greedy = SignatureClient("translate_with_options", saved_model=exported[2],
                             settings={"beam_size": 1})(text=["A man in a blue shirt."])
    shown = browser.find_element(By.ID, "translation").text
    assert shown.replace("<b>", "").replace("</b>", "").split() == greedy["translation"][0].decode().split()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#nbest li")) == 1
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


@pytest.mark.parametrize("text, fragment", [
    ("   ", "The line is empty"),
    ("word " * 500, "this page translates lines of at most 2,000 characters"),
])
def test_an_empty_or_overlong_line_gets_a_message_and_no_request(server, browser, text, fragment):
    from selenium.webdriver.common.by import By

    submit(browser, server + "/", text)
    assert fragment in browser.find_element(By.ID, "message").text
    assert browser.find_element(By.ID, "result").get_attribute("hidden")


def test_a_line_cut_to_the_input_limit_is_translated_with_a_notice(server, browser):
    from selenium.webdriver.common.by import By

    submit(browser, server + "/", " ".join(["dog"] * 40))       # the tiny export reads at most 20 tokens
    assert "input limit of 20 tokens" in browser.find_element(By.ID, "message").text
    assert not browser.find_element(By.ID, "result").get_attribute("hidden")


def test_items_are_kept_verbatim_and_tags_kept_when_the_line_holds_html(server, browser):
    """The page asks for protect: a time and a URL come back once each (this
    tiny model loses their masks: put back by the attention, with a notice).
    With the HTML box ticked, the tags come back once each, as text."""
    from selenium.webdriver.common.by import By

    submit(browser, server + "/", "A man at 7:30 runs to www.example.org.")
    text = browser.find_element(By.ID, "translation").text
    assert [text.count(item) for item in ("7:30", "www.example.org")] == [1, 1] and "°" not in text
    message = browser.find_element(By.ID, "message")
    assert message.get_attribute("hidden") or "The model lost the placeholder" in message.text
    load(browser, server + "/")
    browser.find_element(By.ID, "markup").click()
    box = browser.find_element(By.ID, "source")
    box.send_keys("A <b>man</b> is running.")
    browser.find_element(By.ID, "submit").click()
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 60).until(lambda b: not b.find_element(By.ID, "result").get_attribute("hidden"))
    text = browser.find_element(By.ID, "translation").text
    assert text.count("<b>") == 1 and text.count("</b>") == 1, text


def test_a_stopped_server_and_a_failing_one_get_a_message(exported, tmp_path_factory, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    servers = start(exported, tmp_path_factory)
    url = f"http://127.0.0.1:{servers[2].port}/"
    load(browser, url)
    stop(servers)
    box = browser.find_element(By.ID, "source")
    box.send_keys(SENTENCE)
    box.submit()
    WebDriverWait(browser, 30).until(lambda b: not b.find_element(By.ID, "message").get_attribute("hidden"))
    assert "The server cannot be reached" in browser.find_element(By.ID, "message").text

    # A server whose API answers an error: its message is shown with the HTTP status.
    srv, registry, rest = start(exported, tmp_path_factory)
    rest.stop()
    failing = rest_api.RestServer(RestSettings(host="127.0.0.1", threads=2, max_message_mb=1.0),
                                  lambda *a, **k: (500, rest_api.error_json("INTERNAL: the model broke")),
                                  functools.partial(page.page_file, registry))
    try:
        submit(browser, f"http://127.0.0.1:{failing.port}/", SENTENCE)
        assert ("The server answered with an error (HTTP 500): INTERNAL: the model broke"
                in browser.find_element(By.ID, "message").text)
    finally:
        failing.stop()
        registry.stop()
        srv.stop(grace=0)


def test_a_low_confidence_is_shown_as_a_warning(trained_model_dir, tmp_path, browser):
    """An export whose model directory has a calibrator answers a confidence;
    under 0.5 the page says not to rely on the translation."""
    from selenium.webdriver.common.by import By

    from nmt_tf.config import ExportConfig, SearchOptions
    from nmt_tf.exporting import saved_model as exporter
    from nmt_tf.inference import confidence

    model_dir = str(tmp_path / "model")
    shutil.copytree(trained_model_dir[0], model_dir)
    zero = (0.0,) * len(confidence.FEATURES)
    for intercept, expected in ((-3.0, "Low confidence (5 %)"), (3.0, "Confidence 95 %")):
        confidence.Calibrator(zero, (1.0,) * len(zero), zero, intercept, (), 5, "test", "test").save(
            confidence.path_in(model_dir))
        base = str(tmp_path / f"export{intercept}")
        exporter.export(model_dir, base, ExportConfig(SearchOptions(beam_size=2, n_best=2), max_input_length=20),
                        log=lambda *a: None)
        srv, registry, _ = nmt_server.start_server("nmt", base, port=0, host="127.0.0.1", threads=2,
                                                   log=lambda *a: None)
        servers = (srv, registry, rest_api.start_rest_server(registry, RestSettings(host="127.0.0.1", threads=2)))
        try:
            submit(browser, f"http://127.0.0.1:{servers[2].port}/", SENTENCE)
            line = browser.find_element(By.ID, "confidence")
            assert not line.get_attribute("hidden") and line.text.startswith(expected), line.text
            assert ("low" in line.get_attribute("class")) == (intercept < 0)
        finally:
            stop(servers)
