"""The JSON-Schema form renderer in a real headless Chromium, on a static test page.

The page renders a schema with `SchemaForm` and records what the form submits; the tests
type, pick and click like a person would, and play the server's part for errors.
"""

from __future__ import annotations

import json
from typing import Any

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from tests.browser.browser_kit import control, describedby, group, retype, screenshot, wait_for

TICKET: dict[str, Any] = {
    "type": "object",
    "title": "Ticket details",
    "required": ["affected_system", "impact_scope", "users", "contact"],
    "properties": {
        "affected_system": {"type": "string", "title": "Affected system", "description": "The system that fails."},
        "impact_scope": {"type": "string", "enum": ["ONE_USER", "ALL_USERS"], "description": "Who is affected."},
        "users": {"type": "integer", "title": "Users affected", "minimum": 1},
        "cost": {"type": "number", "title": "Cost per hour", "default": 2.5},
        "urgent": {"type": "boolean", "title": "Urgent", "default": True},
        "notify": {"type": "boolean", "title": "Notify the team"},
        "tags": {"type": "array", "title": "Tags", "items": {"type": "string", "title": "Tag"}, "default": ["vpn"]},
        "contact": {
            "type": "object",
            "title": "Contact",
            "description": "Who to call back.",
            "required": ["email"],
            "properties": {
                "email": {"type": "string", "title": "Email"},
                "phone": {"type": "string", "title": "Phone"},
            },
        },
        "steps": {
            "type": "array",
            "title": "Steps tried",
            "items": {
                "type": "object",
                "title": "Step",
                "required": ["action"],
                "properties": {
                    "action": {"type": "string", "title": "Action"},
                    "minutes": {"type": "integer", "title": "Minutes"},
                },
            },
        },
    },
}


def render(driver: WebDriver, schema: dict[str, Any], **options: Any) -> WebElement:
    # JSON text keeps the order of the properties (the driver's own encoding sorts keys).
    driver.execute_script(
        "return window.harness.render(JSON.parse(arguments[0]), JSON.parse(arguments[1]))",
        json.dumps(schema),
        json.dumps(options),
    )
    return driver.find_element(By.CSS_SELECTOR, "#root form")


def submissions(driver: WebDriver) -> list[Any]:
    result: list[Any] = driver.execute_script("return window.harness.submissions")
    return result


def submit(driver: WebDriver) -> None:
    count = len(submissions(driver))
    driver.find_element(By.CSS_SELECTOR, "#root form button[type=submit]").click()
    wait_for(lambda: len(submissions(driver)) > count, message="a submission")


def answer_with_errors(
    driver: WebDriver, details: list[dict[str, str]], message: str = "Form data is not valid."
) -> None:
    driver.execute_script("window.harness.nextError = {message: arguments[0], details: arguments[1]}", message, details)


def error_of(driver: WebDriver, element: WebElement) -> str:
    """Text of the error the element's aria-describedby points at ("" when none)."""
    texts = [e.text for e in describedby(driver, element) if "field-error" in (e.get_attribute("class") or "")]
    return " | ".join(texts)


def fill_ticket(driver: WebDriver, form: WebElement) -> None:
    control(form, "Affected system").send_keys("login")
    Select(control(form, "Impact scope")).select_by_visible_text("ALL_USERS")
    control(form, "Users affected").send_keys("0")
    retype(control(form, "Cost per hour"), "3.75")
    control(form, "Notify the team").click()
    tags = group(form, "Tags")
    tags.find_element(By.XPATH, ".//button[normalize-space()='Add tag']").click()
    control(tags, "Tag 2").send_keys("wifi")
    contact = group(form, "Contact")
    control(contact, "Phone").send_keys("555-0100")
    steps = group(form, "Steps tried")
    add_step = steps.find_element(By.XPATH, ".//button[normalize-space()='Add step']")
    add_step.click()
    add_step.click()
    first, second = group(steps, "Step 1"), group(steps, "Step 2")
    control(first, "Action").send_keys("rebooted")
    control(first, "Minutes").send_keys("5")
    control(second, "Action").send_keys("cleared cache")
    control(second, "Minutes").send_keys("ten")


def test_every_schema_kind_renders_with_labels_help_required_marks_and_defaults(form_page: WebDriver) -> None:
    form = render(form_page, TICKET)

    system = control(form, "Affected system")
    assert system.tag_name == "input" and system.get_attribute("type") == "text"
    assert system.get_attribute("aria-required") == "true"
    assert [e.text for e in describedby(form_page, system)] == ["The system that fails."]
    scope = Select(control(form, "Impact scope"))
    assert [o.text for o in scope.options] == ["Choose…", "ONE_USER", "ALL_USERS"]
    assert scope.first_selected_option.text == "Choose…"
    assert control(form, "Users affected").get_attribute("inputmode") == "numeric"
    cost = control(form, "Cost per hour")
    assert cost.get_attribute("inputmode") == "decimal" and cost.get_attribute("value") == "2.5"
    assert cost.get_attribute("aria-required") is None
    assert control(form, "Urgent").is_selected() and not control(form, "Notify the team").is_selected()
    assert control(group(form, "Tags"), "Tag 1").get_attribute("value") == "vpn"
    contact = group(form, "Contact")
    assert contact.find_element(By.CSS_SELECTOR, ".help").text == "Who to call back."
    assert control(contact, "Email").get_attribute("aria-required") == "true"
    assert control(contact, "Phone").get_attribute("aria-required") is None
    assert group(form, "Steps tried").find_elements(By.CSS_SELECTOR, ".array-item") == []

    required = {
        e.find_element(By.XPATH, "./ancestor::*[1]").text.strip(" *")
        for e in form.find_elements(By.CSS_SELECTOR, "label .required-mark, legend .required-mark")
    }
    assert required == {"Affected system", "Impact scope", "Users affected", "Contact", "Email"}
    # Every control has a label (or, for groups, a legend): nothing is left unnamed.
    for element in form.find_elements(By.CSS_SELECTOR, "input, select, textarea"):
        element_id = element.get_attribute("id")
        assert element_id and form.find_elements(By.CSS_SELECTOR, f"label[for='{element_id}']"), element.get_attribute(
            "outerHTML"
        )
    for button in form.find_elements(By.CSS_SELECTOR, "button"):
        assert button.tag_name == "button" and (button.text or button.get_attribute("aria-label"))
    screenshot(form_page, "form-renderer-empty")


def test_typed_values_are_submitted_with_their_json_types(form_page: WebDriver) -> None:
    form = render(form_page, TICKET)
    fill_ticket(form_page, form)
    control(group(form, "Contact"), "Email").send_keys("ops@example.com")
    steps = group(form, "Steps tried")
    retype(control(group(steps, "Step 2"), "Minutes"), "10")

    submit(form_page)

    assert submissions(form_page) == [
        {
            "affected_system": "login",
            "impact_scope": "ALL_USERS",
            "users": 0,
            "cost": 3.75,
            "urgent": True,
            "notify": True,
            "tags": ["vpn", "wifi"],
            "contact": {"email": "ops@example.com", "phone": "555-0100"},
            "steps": [{"action": "rebooted", "minutes": 5}, {"action": "cleared cache", "minutes": 10}],
        }
    ]


def test_server_errors_show_next_to_each_field_and_entered_values_stay(form_page: WebDriver) -> None:
    form = render(form_page, TICKET)
    fill_ticket(form_page, form)
    answer_with_errors(
        form_page,
        [
            {"path": "/users", "message": "0 is less than the minimum of 1"},
            {"path": "/contact", "message": "'email' is a required property"},
            {"path": "/steps/1/minutes", "message": "'ten' is not of type 'integer'"},
            {"path": "/tags/1", "message": "'wifi' is not one of the known tags"},
        ],
    )

    submit(form_page)

    # The value that could not be read as a number went to the server as typed.
    assert submissions(form_page)[0]["steps"][1]["minutes"] == "ten"
    users = control(form, "Users affected")
    email = control(group(form, "Contact"), "Email")
    minutes = control(group(group(form, "Steps tried"), "Step 2"), "Minutes")
    tag = control(group(form, "Tags"), "Tag 2")
    wait_for(lambda: error_of(form_page, users), message="the error of Users affected")
    assert error_of(form_page, users) == "0 is less than the minimum of 1"
    assert error_of(form_page, email) == "'email' is a required property"
    assert error_of(form_page, minutes) == "'ten' is not of type 'integer'"
    assert error_of(form_page, tag) == "'wifi' is not one of the known tags"
    for element in (users, email, minutes, tag):
        assert element.get_attribute("aria-invalid") == "true"
    assert control(form, "Affected system").get_attribute("aria-invalid") is None
    assert error_of(form_page, control(form, "Affected system")) == ""

    summary = form.find_element(By.CSS_SELECTOR, ".error-summary")
    assert summary.is_displayed() and summary.get_attribute("role") == "alert"
    assert form_page.switch_to.active_element == summary
    assert [li.text for li in summary.find_elements(By.TAG_NAME, "li")] == [
        "Users affected: 0 is less than the minimum of 1",
        "Email: 'email' is a required property",
        "Minutes: 'ten' is not of type 'integer'",
        "Tag 2: 'wifi' is not one of the known tags",
    ]
    summary.find_element(By.XPATH, ".//button[contains(., 'Minutes')]").click()
    assert form_page.switch_to.active_element == minutes

    # Everything typed is still there.
    assert control(form, "Affected system").get_attribute("value") == "login"
    assert Select(control(form, "Impact scope")).first_selected_option.text == "ALL_USERS"
    assert users.get_attribute("value") == "0"
    assert control(form, "Cost per hour").get_attribute("value") == "3.75"
    assert control(form, "Notify the team").is_selected()
    assert minutes.get_attribute("value") == "ten" and tag.get_attribute("value") == "wifi"
    assert control(group(form, "Contact"), "Phone").get_attribute("value") == "555-0100"
    screenshot(form_page, "form-renderer-errors")

    # Fix the fields and send again: errors go away and the corrected data is submitted.
    users.send_keys(Keys.BACKSPACE, "12")
    email.send_keys("ops@example.com")
    retype(minutes, "10")
    retype(tag, "lan")
    submit(form_page)

    last = submissions(form_page)[-1]
    assert (last["users"], last["contact"]["email"], last["steps"][1]["minutes"], last["tags"]) == (
        12,
        "ops@example.com",
        10,
        ["vpn", "lan"],
    )
    assert not summary.is_displayed()
    assert form.find_elements(By.CSS_SELECTOR, "[aria-invalid='true']") == []
    assert all(not e.is_displayed() for e in form.find_elements(By.CSS_SELECTOR, ".field-error"))


def test_an_error_without_a_matching_field_is_shown_above_the_form(form_page: WebDriver) -> None:
    form = render(form_page, TICKET)
    answer_with_errors(form_page, [{"path": "/unknown_field", "message": "Additional properties are not allowed"}])

    submit(form_page)

    summary = form.find_element(By.CSS_SELECTOR, ".error-summary")
    wait_for(summary.is_displayed, message="the error summary")
    assert [li.text for li in summary.find_elements(By.TAG_NAME, "li")] == ["Additional properties are not allowed"]

    answer_with_errors(form_page, [], message="The turn is no longer waiting for this form.")
    submit(form_page)
    wait_for(lambda: "no longer waiting" in summary.text, message="the general error")


def test_array_items_are_added_and_removed_by_keyboard(form_page: WebDriver) -> None:
    form = render(form_page, TICKET)
    tags = group(form, "Tags")
    add = tags.find_element(By.XPATH, ".//button[normalize-space()='Add tag']")
    add.send_keys(Keys.ENTER)
    # The new item's input has the focus; type straight into it.
    assert form_page.switch_to.active_element == control(tags, "Tag 2")
    form_page.switch_to.active_element.send_keys("wifi")
    add.send_keys(Keys.SPACE)
    form_page.switch_to.active_element.send_keys("lan")
    remove_first = tags.find_element(By.XPATH, ".//button[@aria-label='Remove tag 1 of Tags']")
    remove_first.send_keys(Keys.ENTER)

    # Items are renumbered and focus stays in the list.
    assert [control(tags, f"Tag {i}").get_attribute("value") for i in (1, 2)] == ["wifi", "lan"]
    assert form_page.switch_to.active_element.get_attribute("aria-label") == "Remove tag 1 of Tags"
    control(form, "Affected system").send_keys("x")
    submit(form_page)
    assert submissions(form_page)[-1]["tags"] == ["wifi", "lan"]

    for _ in range(2):
        tags.find_element(By.CSS_SELECTOR, "button.remove").click()
    submit(form_page)
    # The person emptied a list that had a default: an empty list is what they chose.
    assert submissions(form_page)[-1]["tags"] == []
    # An optional list without a default that stays empty is left out.
    assert "steps" not in submissions(form_page)[-1]


def test_focus_is_visible_on_keyboard_navigation(form_page: WebDriver) -> None:
    form = render(form_page, TICKET)
    control(form, "Affected system").click()
    form_page.switch_to.active_element.send_keys(Keys.TAB)
    focused = form_page.switch_to.active_element
    assert focused == control(form, "Impact scope")
    outline = form_page.execute_script(
        "const s = getComputedStyle(arguments[0]); return [s.outlineStyle, s.outlineWidth]", focused
    )
    assert outline[0] != "none" and outline[1] != "0px"


def test_refs_nullable_unions_consts_and_free_json(form_page: WebDriver) -> None:
    # The shape pydantic's model_json_schema() produces.
    schema = {
        "$defs": {
            "Address": {
                "type": "object",
                "title": "Address",
                "required": ["city"],
                "properties": {
                    "city": {"type": "string", "title": "City"},
                    "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Zip"},
                },
            },
            "Priority": {"enum": ["low", "high"], "type": "string", "title": "Priority"},
        },
        "type": "object",
        "required": ["address", "mode"],
        "properties": {
            "address": {"$ref": "#/$defs/Address"},
            "priority": {"allOf": [{"$ref": "#/$defs/Priority"}], "default": "high"},
            "mode": {
                "oneOf": [{"const": "fast", "title": "Fast lane"}, {"const": "safe", "title": "Safe lane"}],
                "title": "Mode",
            },
            "limit": {"type": ["integer", "null"], "title": "Limit"},
            "extra": {"title": "Extra", "description": "Any JSON value."},
        },
    }
    form = render(form_page, schema)
    address = group(form, "Address")
    control(address, "City").send_keys("Oslo")
    assert Select(control(form, "Priority")).first_selected_option.text == "high"
    mode = Select(control(form, "Mode"))
    assert [o.text for o in mode.options] == ["Choose…", "Fast lane", "Safe lane"]
    mode.select_by_visible_text("Safe lane")
    control(form, "Limit").send_keys("7")
    control(form, "Extra").send_keys('{"a": [1, 2]}')

    submit(form_page)

    assert submissions(form_page) == [
        {"address": {"city": "Oslo"}, "priority": "high", "mode": "safe", "limit": 7, "extra": {"a": [1, 2]}}
    ]


def test_root_schema_that_is_not_an_object(form_page: WebDriver) -> None:
    form = render(
        form_page, {"type": "array", "title": "Names", "items": {"type": "string", "title": "Name"}, "minItems": 1}
    )
    names = group(form, "Names")
    control(names, "Name 1").send_keys("Ada")
    answer_with_errors(form_page, [{"path": "/0", "message": "'Ada' is too short"}])

    submit(form_page)

    assert submissions(form_page) == [["Ada"]]
    wait_for(lambda: error_of(form_page, control(names, "Name 1")) == "'Ada' is too short", message="the item error")


def test_readable_at_phone_width(form_page: WebDriver) -> None:
    form_page.set_window_size(375, 812)
    form = render(form_page, TICKET)
    fill_ticket(form_page, form)
    answer_with_errors(form_page, [{"path": "/users", "message": "0 is less than the minimum of 1"}])
    submit(form_page)
    wait_for(lambda: error_of(form_page, control(form, "Users affected")), message="the error")

    width = form_page.execute_script("return document.documentElement.clientWidth")
    scroll_width = form_page.execute_script("return document.documentElement.scrollWidth")
    assert scroll_width <= width, f"page scrolls sideways at {width}px: {scroll_width}px wide"
    for element in form.find_elements(By.CSS_SELECTOR, "input, select, textarea, button"):
        rect = form_page.execute_script(
            "const r = arguments[0].getBoundingClientRect(); return [r.left, r.right]", element
        )
        assert rect[0] >= 0 and rect[1] <= width, element.get_attribute("outerHTML")
    screenshot(form_page, "form-renderer-phone")
